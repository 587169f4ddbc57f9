"""`waypost demo --quick` end to end: real etcd and backend processes, and the memory fallback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from waypost.balancer.policies import POLICIES as REGISTERED
from waypost.demo.load import Sample, percentile, summarize
from waypost.demo.runner import BACKENDS, NEWCOMER, NOT_SHOWN, POLICIES, SLOW, VICTIM, takeaway
from waypost.etcd.local import free_port
from waypost.service_config import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def run_demo(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-m", "waypost.cli", "--registry", f"etcd://127.0.0.1:{free_port()}", "demo", "--quick",
         "--out", str(tmp_path), "--summary-json", str(summary)],
        check=False, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env,
    )
    assert summary.exists(), proc.stderr[-2000:]
    return proc, json.loads(summary.read_text())


def check_results(out: dict) -> None:
    names = [b[0] for b in BACKENDS]
    assert sorted(out["policies"]) == sorted(POLICIES)
    for policy, s in out["policies"].items():
        assert s["calls"] > 0 and s["errors"] == 0, (policy, s)
        assert set(s["backends"]) == set(names)
    # pick_first sends everything to one backend; round_robin spreads over all four
    assert max(b["share"] for b in out["policies"]["pick_first"]["backends"].values()) == 1.0
    assert all(b["calls"] > 0 for b in out["policies"]["round_robin"]["backends"].values())
    # the default policy is shown beside go-zero's p2c_ewma and round_robin; round_robin gives the slow backend a
    # quarter of the calls, the default (latency-aware) much less
    assert {"round_robin", "p2c_ewma", DEFAULT_POLICY} <= set(out["policies"])
    shares = {p: out["policies"][p]["backends"][SLOW]["share"] for p in ("round_robin", DEFAULT_POLICY)}
    assert shares[DEFAULT_POLICY] < shares["round_robin"] / 2, shares
    ch = out["policies"]["consistent_hash"]["sticky"]
    assert ch["keys"] > 0 and ch["always_same_backend"] == ch["keys"]

    fo = out["failover"]
    assert fo["errors"] == 0, fo  # the retry policy hides the killed backend
    assert fo["newcomer_first_call_s"] is not None  # the new backend got traffic
    assert fo["phases"]["after add"]["backends"][NEWCOMER[0]]["calls"] > 0
    assert fo["victim_calls_after_kill"] == 0, f"{VICTIM} still answered after its kill"


def test_demo_quick_with_etcd(tmp_path):
    proc, out = run_demo(tmp_path, dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out["registry_mode"] == "local etcd"
    check_results(out)
    assert Path(out["chart"]).is_file() and Path(out["chart"]).stat().st_size > 10_000
    assert "chart:" in proc.stdout and "0 failed calls" in proc.stdout and "SIGKILL" in proc.stdout
    # the closing line: from this run's figures, on one line
    assert out["takeaway"] == takeaway(out["policies"]) and out["takeaway"].startswith("Takeaway: ")
    assert out["takeaway"] in proc.stdout.splitlines(), proc.stdout[-2000:]
    assert f"{len(POLICIES)} of {len(REGISTERED)} policies run; not run here: " in proc.stdout  # the others, named with why
    assert all(f"{p} (" in proc.stdout for p in NOT_SHOWN), proc.stdout
    # every process the demo started is gone
    assert len(out["pids"]) == len(BACKENDS) + 1 + 1  # 4 backends, the newcomer, etcd
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in out["pids"]):
        time.sleep(0.05)
    assert not [p for p in out["pids"] if _alive(p)]


def test_demo_quick_without_etcd_binary_uses_memory(tmp_path):
    env = dict(os.environ, WAYPOST_ETCD_BIN=str(tmp_path / "no-etcd-here"))
    proc, out = run_demo(tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out["registry_mode"] == "memory"
    assert "memory registry" in proc.stdout
    check_results(out)
    assert out["pids"] == []  # backends ran as threads


def test_summaries():
    samples = [Sample(0.1, 0.002, "b1"), Sample(0.2, 0.004, "b1"), Sample(0.3, 0.030, "b4"),
               Sample(0.4, 0.001, None, "UNAVAILABLE")]
    s = summarize(samples, ["b1", "b4"])
    assert (s["calls"], s["ok"], s["errors"], s["error_codes"]) == (4, 3, 1, {"UNAVAILABLE": 1})
    assert s["backends"]["b1"]["calls"] == 2 and s["backends"]["b4"]["share"] == pytest.approx(1 / 3)
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 99) == 4 and percentile([], 50) == 0.0


def test_demo_interrupted_cleans_up(tmp_path):
    summary = tmp_path / "summary.json"
    # A test run started in the background (`pytest &` in a script) ignores SIGINT, and an ignored SIGINT
    # is inherited: the child would never see the Ctrl-C this test sends. A handled one is reset to the
    # default by exec, so hold a handler while starting the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "waypost.cli", "--registry", f"etcd://127.0.0.1:{free_port()}", "demo", "--quick",
             "--no-chart", "--summary-json", str(summary)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the backends serve traffic
            line = proc.stdout.readline()
            if not line or line.startswith("[3]"):
                break
        assert line.startswith("[3]"), proc.stderr.read()[-2000:] if proc.poll() is not None else line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
    out = json.loads(summary.read_text())
    assert len(out["pids"]) == len(BACKENDS) + 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in out["pids"]):
        time.sleep(0.05)
    assert not [p for p in out["pids"] if _alive(p)]
