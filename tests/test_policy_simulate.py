"""bench/simulate.py --quick runs and prints its summary lines and JSON (shape, not timing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "simulate.py"
SCENARIOS = ["slow_backend", "degrading", "heterogeneous", "flapping"]
POLICIES = ["round_robin", "random", "weighted_round_robin", "least_request", "p2c_ewma", "oracle"]


def test_simulate_quick_output_shape(tmp_path):
    out = tmp_path / "simulate.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    last = lines[-len(SCENARIOS):]
    pattern = re.compile(r"^(\w+): p99 p2c_ewma/round_robin = (\d+\.\d+), p2c_ewma/oracle = (\d+\.\d+)$")
    matches = [pattern.match(line) for line in last]
    assert all(matches), last
    assert [m.group(1) for m in matches if m] == SCENARIOS

    report = json.loads(out.read_text())
    assert set(report["scenarios"]) == set(SCENARIOS)
    for name, m in zip(SCENARIOS, matches):
        sc = report["scenarios"][name]
        assert set(sc["results"]) == set(POLICIES)
        for r in sc["results"].values():
            assert r["calls"] > 0
            assert 0 < r["p50"] <= r["p99"] <= r["p999"]
            assert 0.0 <= r["error_rate"] <= 1.0
            assert len(r["share"]) == 4 and abs(sum(r["share"].values()) - 1.0) < 1e-9
        assert f"{sc['p99_p2c_over_round_robin']:.3f}" == m.group(2)  # type: ignore[union-attr]
        assert f"{sc['p99_p2c_over_oracle']:.3f}" == m.group(3)  # type: ignore[union-attr]


def test_simulate_is_deterministic(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        subprocess.run([sys.executable, str(SCRIPT), "--quick", "--duration", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, check=True)
        report = json.loads(out.read_text())
        report.pop("wall_seconds")
        outs.append(report)
    assert outs[0] == outs[1]
