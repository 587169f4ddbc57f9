#!/usr/bin/env python3
"""k8s:// propagation against a real kube-apiserver, beside the apiserver's own watch latency in the same run.

An EndpointSlice gains a ready pod ``--changes`` times (and loses it in between). Each time, from just before
the write (a plain HTTP PUT):

- **raw watch**: a plain HTTP watch of the service's slices (one request, JSON lines read as they come)
  sees the event: the floor set by the apiserver and etcd;
- **waypost**: a ``waypost.dial("k8s://...")`` channel's picker can use the new pod (it is READY in the
  channel's balancer): the resolver's own watch, the diff, the new backend's connection and the new picker.

Everything runs inside a private network namespace made for the run (``unshare -n``, pods on 10.77.0.x), with
kube-apiserver built from source once and cached (harness/k8s/support.py); it needs Go, ``unshare`` and ``ip``.

Usage: python bench/k8s.py [--changes N] [--out PATH]
The last lines are the figures and their ratio; they go to bench/results/k8s.json. Default run ~30 s once the
apiserver binary is cached.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from harness.k8s import support as k8s_support


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=40)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "k8s.json"))
    args = ap.parse_args(argv)
    reason = k8s_support.skip_reason(netns=True)
    if reason:
        print(f"bench/k8s.py: cannot run here: {reason}", file=sys.stderr)
        return 2
    binary = k8s_support.apiserver_binary()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="waypost-bench-k8s-") as tmp:
        samples = Path(tmp) / "samples.json"
        with k8s_support.NetnsHost(binary=binary, log_dir=tmp) as host:
            host.run("bench_slice_to_picker", timeout=60 + args.changes * 5,
                     args={"changes": args.changes, "out": str(samples)})
        data = json.loads(samples.read_text())
    raw, pick = data["raw_watch_ms"], data["picker_ms"]
    rows = {name: {"p50_ms": round(statistics.median(xs), 2), "p99_ms": round(pct(xs, 0.99), 2),
                   "max_ms": round(max(xs), 2), "n": len(xs)}
            for name, xs in (("raw_watch", raw), ("waypost_picker", pick))}
    result = {
        "bench": "k8s", "changes": args.changes, "seconds": round(time.monotonic() - t0, 1),
        "python": platform.python_version(), "machine": platform.machine(), "results": rows,
        "ratio_p50": round(rows["waypost_picker"]["p50_ms"] / rows["raw_watch"]["p50_ms"], 2),
        "ratio_p99": round(rows["waypost_picker"]["p99_ms"] / rows["raw_watch"]["p99_ms"], 2),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'EndpointSlice change ->':<34}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'n':>5}")
    for name, label in (("raw_watch", "raw watch event (floor)"), ("waypost_picker", "waypost picker has the pod")):
        r = rows[name]
        print(f"  {label:<32}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['max_ms']:>9.2f}{r['n']:>5}")
    print(f"waypost / raw watch: p50 x{result['ratio_p50']}, p99 x{result['ratio_p99']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
