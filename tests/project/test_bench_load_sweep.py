"""bench/load_sweep.py runs end to end (real backend subprocesses) and writes its JSON: a smoke test.

No timing assertion: only that the run completes, prints its lines and the JSON holds every run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_quick_sweep_runs_and_writes_json(tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/load_sweep.py"), "--quick", "--scenarios", "antagonist",
         "--policies", "round_robin,peak_ewma,prequal,default", "--seconds", "0.6", "--warmup", "0.2", "--out", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("sweep worst: p99 default/oracle = ")
    for policy in ("round_robin", "peak_ewma", "prequal", "default"):
        assert any(line.startswith(f"sweep antagonist c=4: p99 {policy}/oracle = ") for line in lines), lines
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["scenario"] == "antagonist" and row["callers"] == 4
    assert set(row["results"]) == {"round_robin", "peak_ewma", "prequal", "default", "oracle"}
    assert all(r["calls"] > 0 for r in row["results"].values())
    assert data["default_policy"]


def test_unknown_scenario_is_refused_with_the_choices():
    proc = subprocess.run([sys.executable, str(ROOT / "bench/load_sweep.py"), "--scenarios", "nope"],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown scenario" in proc.stderr and "antagonist" in proc.stderr


@pytest.mark.timeout(240)
def test_open_loop_at_a_utilization_runs_each_policy_and_the_oracle(tmp_path):
    out = tmp_path / "open.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/load_sweep.py"), "--scenarios", "hetero248", "--utils", "50",
         "--policies", "peak_ewma,default", "--seconds", "0.6", "--warmup", "0.2", "--out", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for policy in ("peak_ewma", "default"):
        assert any(line.startswith(f"sweep hetero248/open u=50%: p99 {policy}/oracle = ") for line in lines), lines
    (row,) = json.loads(out.read_text())["rows"]
    assert row["util"] == 50 and row["rate"] == pytest.approx(0.5 * (2 + 4 + 8) / 0.040)
    assert set(row["results"]) == {"peak_ewma", "default", "oracle"}
    assert all(r["calls"] > 0 for r in row["results"].values())
    # the oracle splits by capacity, 2:4:8
    share = row["results"]["oracle"]["share"]
    assert share["hetero2482"] > share["hetero2480"]
