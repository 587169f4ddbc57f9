"""bench/hedging.py runs end to end, both parts, on a small scale, and writes its JSON: a smoke test. The
simulation is seeded, so its counts are checked (the extra calls stay within the default 5 % cap); no timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_small_run_writes_both_parts(tmp_path):
    out = tmp_path / "hedging.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/hedging.py"), "--requests", "300", "--backends", "3", "--real-fanout", "3",
         "--real-requests", "30", "--real-warmup", "2", "--real-seconds", "20", "--out", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-2].startswith("hedging sim: p99.9 vs none: fixed ") and lines[-1].startswith("hedging real: ")
    results = json.loads(out.read_text())["results"]
    for part in ("sim", "real"):
        assert set(results[part]) == {"none", "fixed", "p95", "p98"}
        assert results[part]["none"]["hedges"] == 0
    sim = results["sim"]
    assert all(sim[m]["calls"] == 300 * 100 for m in sim)
    assert all(0 < sim[m]["hedges"] <= 0.05 * sim[m]["calls"] for m in ("fixed", "p95", "p98"))
