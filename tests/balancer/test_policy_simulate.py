"""bench/simulate.py --quick runs and prints its summary lines and JSON (shape, not timing).

The simulation is deterministic (seeded, on a simulated clock), so the ranking facts below are exact for the seed
used, not timing-dependent; the ones asserted hold with a wide margin (and for other seeds).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from waypost.service_config import DEFAULT_POLICY

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "simulate.py"
SCENARIOS = ["slow_backend", "degrading", "heterogeneous", "flapping", "cold_start"]
SLOW_START_POLICIES = ["least_request", "p2c_ewma", "peak_ewma", "prequal"]
POLICIES = ["round_robin", "random", "smooth_weighted_round_robin", "least_request", "p2c_ewma", "peak_ewma", "prequal",
            "default", "oracle"]
SWEEP_POLICIES = [p for p in POLICIES if p not in ("random", "smooth_weighted_round_robin")]
FLEETS = ["slow_tenth", "hetero_cap", "noisy_neighbour", "bursty", "bimodal", "few_clients", "many_clients",
          "no_reports"]
UTILS = [50, 80, 95]  # --quick's


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any]]:
    """One ``--quick`` run (scenarios and sweep) serves the tests that read its output."""
    out = tmp_path_factory.mktemp("simulate") / "simulate.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines(), json.loads(out.read_text())


def _load_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_simulate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_simulate_quick_output_shape(quick_run):
    lines, report = quick_run
    last = lines[-len(SCENARIOS):]
    pattern = re.compile(r"^(\w+): p99 p2c_ewma/round_robin = (\d+\.\d+), p2c_ewma/oracle = (\d+\.\d+)$")
    matches = [pattern.match(line) for line in last]
    assert all(matches), last
    assert [m.group(1) for m in matches if m] == SCENARIOS

    assert set(report["scenarios"]) == set(SCENARIOS)
    assert report["default_policy"] == DEFAULT_POLICY
    for name, m in zip(SCENARIOS, matches):
        sc = report["scenarios"][name]
        assert set(sc["results"]) == set(POLICIES)
        for r in sc["results"].values():
            assert r["calls"] > 0
            assert 0 < r["p50"] <= r["p99"] <= r["p999"]
            assert 0.0 <= r["error_rate"] <= 1.0
            assert len(r["share"]) == 4 and abs(sum(r["share"].values()) - 1.0) < 1e-9
        assert sc["results"]["default"] == sc["results"][DEFAULT_POLICY]
        assert 0 < sc["results"]["prequal"]["probes_per_call"] <= 1.0  # the simulated prober was used
        assert f"{sc['p99_p2c_over_round_robin']:.3f}" == m.group(2)  # type: ignore[union-attr]
        assert f"{sc['p99_p2c_over_oracle']:.3f}" == m.group(3)  # type: ignore[union-attr]


def test_cold_start_prints_each_ramping_policy_without_and_with_slow_start(quick_run):
    lines, report = quick_run
    sc = report["scenarios"]["cold_start"]
    newcomer = "10.0.0.4:8080"
    assert sc["slow_start"]["window"] == "10s" and set(sc["slow_start"]["results"]) == set(SLOW_START_POLICIES)
    assert sc["results"]["oracle"]["share"][newcomer] == 0.0  # the oracle never sees the cold backend
    assert sc["results"]["round_robin"]["share"][newcomer] == pytest.approx(0.25, abs=0.01)  # measured from the join
    pattern = re.compile(r"^cold_start (\w+): p99 (\d+\.\d) ms, newcomer (\d+\.\d)% \((\d+\.\d)%\), errors "
                         r"(\d+\.\d\d)% \| slowStartWindow 10s: p99 (\d+\.\d) ms, newcomer (\d+\.\d)% "
                         r"\((\d+\.\d)%\), errors (\d+\.\d\d)%$")
    printed = {m.group(1): m.groups()[1:] for m in map(pattern.match, lines) if m}
    assert list(printed) == SLOW_START_POLICIES
    for name in SLOW_START_POLICIES:
        plain, ramped = sc["results"][name], sc["slow_start"]["results"][name]
        assert printed[name] == (
            f"{plain['p99'] * 1e3:.1f}", f"{plain['share'][newcomer] * 100:.1f}",
            f"{plain['newcomer_first_second'] * 100:.1f}", f"{plain['error_rate'] * 100:.2f}",
            f"{ramped['p99'] * 1e3:.1f}", f"{ramped['share'][newcomer] * 100:.1f}",
            f"{ramped['newcomer_first_second'] * 100:.1f}", f"{ramped['error_rate'] * 100:.2f}")
        assert ramped["calls"] > 0 and 0 < ramped["share"][newcomer]  # ramped, never starved
    # go-zero's p2c sends a newcomer with no latency yet a flood; the ramp keeps it to a trickle
    p2c, p2c_ramped = sc["results"]["p2c_ewma"], sc["slow_start"]["results"]["p2c_ewma"]
    assert p2c_ramped["newcomer_first_second"] < p2c["newcomer_first_second"] / 3
    assert p2c_ramped["p99"] < p2c["p99"]


def test_sweep_quick_yields_every_policy_for_every_point(quick_run):
    lines, report = quick_run
    sweep = report["sweep"]
    assert sweep["clients"] == 20 and sweep["utils"] == UTILS
    assert set(sweep["fleets"]) == set(FLEETS)
    pattern = re.compile(r"^util (\w+) u=(\d+)%: p99 (\w+)/oracle = (\d+\.\d+), backend utilization max/avg = "
                         r"(\d+)%/(\d+)%$")
    printed = {(m.group(1), int(m.group(2)), m.group(3)): m.groups()[3:] for m in map(pattern.match, lines) if m}
    for fleet in FLEETS:
        fd = sweep["fleets"][fleet]
        assert fd["capacity"] == pytest.approx({"slow_tenth": 18400, "hetero_cap": 23000, "noisy_neighbour": 19000,
                                                "bursty": 23000, "bimodal": 20000, "few_clients": 23000,
                                                "many_clients": 8000, "no_reports": 23000}[fleet])
        for u in UTILS:
            point = fd["points"][str(u)]
            assert point["rate"] == pytest.approx(fd["capacity"] * u / 100)
            assert set(point["results"]) == set(SWEEP_POLICIES)
            for name, r in point["results"].items():
                assert r["calls"] > 0, (fleet, u, name)
                assert 0 < r["p50"] <= r["p99"] <= r["p999"]
                assert abs(sum(r["share_by_kind"].values()) - 1.0) < 1e-9
                assert 0 < r["util_avg"] <= r["util_max"] <= 1.0 + 1e-9
            assert point["results"]["default"] == point["results"][DEFAULT_POLICY]
            assert set(point["p99_over_oracle"]) == set(SWEEP_POLICIES) - {"oracle"}
            for name, ratio in point["p99_over_oracle"].items():
                r = point["results"][name]
                assert printed[(fleet, u, name)] == (f"{ratio:.3f}", f"{r['util_max'] * 100:.0f}",
                                                     f"{r['util_avg'] * 100:.0f}")
    ranked = [row["policy"] for row in sweep["ranking"]]
    assert sorted(ranked) == sorted(set(SWEEP_POLICIES) - {"oracle", "default"})
    worst = [row["worst_p99_over_oracle"] for row in sweep["ranking"]]
    assert worst == sorted(worst)
    rank_lines = [line for line in lines if line.startswith("util rank ")]
    assert [line.split(": ", 1)[1].split(" ", 1)[0] for line in rank_lines] == ranked
    assert any(line.startswith(f"util default = {DEFAULT_POLICY}: worst p99/oracle = ") for line in lines)


def test_sweep_ranking_facts(quick_run):
    """What holds robustly: latency-aware policies avoid the slow tenth; load-blind ones overload it."""
    points = {f: {int(u): p for u, p in fd["points"].items()} for f, fd in quick_run[1]["sweep"]["fleets"].items()}
    for u in (80, 95):
        r = {name: res["p99"] for name, res in points["slow_tenth"][u]["results"].items()}
        # round_robin sends a tenth of the calls to backends with a fifth of the capacity: a queue that grows
        assert r["peak_ewma"] < r["round_robin"] / 2, (u, r)
        assert r["prequal"] < r["round_robin"], (u, r)
        share = {name: res["share_by_kind"]["4x50ms"] for name, res in points["slow_tenth"][u]["results"].items()}
        assert share["round_robin"] == pytest.approx(0.1, abs=0.002)
        assert share["peak_ewma"] < 0.05 and share["prequal"] < share["round_robin"], share
    for u in (80, 95):
        r = {name: res["p99"] for name, res in points["hetero_cap"][u]["results"].items()}
        assert r["peak_ewma"] < r["round_robin"] / 2, (u, r)
        # the servers' load on every call (call_load): prequal beats the client-side view at high load
        assert r["prequal"] < r["peak_ewma"], (u, r)
        # ... and without load reports it is peak_ewma again, not worse than half-way to round robin
        n = {name: res["p99"] for name, res in points["no_reports"][u]["results"].items()}
        assert n["prequal"] < n["round_robin"] / 2 and n["prequal"] < 1.5 * n["peak_ewma"], (u, n)
        assert points["no_reports"][u]["results"]["prequal"]["probe_decided"] == 0.0


def test_simulate_is_deterministic(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        subprocess.run([sys.executable, str(SCRIPT), "--quick", "--no-sweep", "--duration", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, check=True)
        report = json.loads(out.read_text())
        report.pop("wall_seconds")
        outs.append(report)
    assert outs[0] == outs[1]


def test_sweep_point_is_deterministic():
    """Same seed, same numbers: 20 clients, the simulated prober, the oracle's random phase (one short point)."""
    sim = _load_module()
    sc = sim.sweep_scenario("slow_tenth", 90, 0.1)
    for name in ("oracle", "prequal", "peak_ewma"):
        a, b = (sim.Simulation(sc, name, 0.2, 7).run() for _ in range(2))
        assert a == b and a["calls"] > 0
        if name == "prequal":
            assert a["probes_per_call"] > 0
    assert sim.Simulation(sc, "prequal", 0.2, 8).run() != sim.Simulation(sc, "prequal", 0.2, 7).run()
