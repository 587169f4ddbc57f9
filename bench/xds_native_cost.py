#!/usr/bin/env python3
"""Where the native xDS path's per-call cost comes from: the same calls, four ways, each in a fresh process.

``waypost.xds.channel`` is a plain grpcio channel on ``xds:///NAME`` whose configuration comes from a control
plane that ``start_local`` runs inside the calling process. Against plain grpcio round_robin it differs in two
ways, which this benchmark separates:

- ``native``: ``grpc.insecure_channel("ipv4:a,b,c")`` with round_robin (the baseline);
- ``native+cp``: the same channel while an idle in-process control plane runs (waypost's control loop thread,
  grpc.aio's server and its poller in the same process): the cost of having the control plane in the process;
- ``xds-remote``: ``xds:///bench`` with the control plane in another process (``waypost xds serve``): the cost
  of gRPC's own xDS stack per call (config selector and route match, cluster manager, cds, priority,
  xds_cluster_impl, wrr_locality, round_robin), with nothing of waypost in the process;
- ``xds-local``: ``waypost.xds.channel`` as users call it (both of the above).

Modes: sync 1 thread, sync 8 threads, aio 64 tasks. Each (mode, variant) runs ``--rounds`` times in a new
process, the variants alternating so machine noise spreads over all of them; the 3 Echo servers (16 worker
threads each) and the remote control plane are shared. Reported per variant: the median and spread of
throughput and of the client's CPU time per call (the calling process's CPU, which scheduling noise moves much
less than throughput), and each one's ratio to ``native``. JSON: bench/results/xds_native_cost.json.

Usage: python bench/xds_native_cost.py [--rounds 5] [--seconds 3] [--modes sync1,sync8,aio64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = ("native", "native+cp", "xds-remote", "xds-local")
NAME = "bench"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("GRPC_XDS_BOOTSTRAP", "GRPC_XDS_BOOTSTRAP_CONFIG"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


# -- the child: one measurement -------------------------------------------------------------------------------

def _child(variant: str, mode: str, seconds: float, addrs: list[str], remote: str) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from channel_overhead import native_aio, native_sync, run_aio, run_sync

    import waypost.xds
    from waypost.xds import ControlPlane, bootstrap_json, parse_export

    direct = "direct:///" + ",".join(addrs)
    idle = None
    if variant == "native+cp":  # an in-process control plane nobody talks to: only its presence is measured
        idle = ControlPlane([parse_export(f"{NAME}={direct}")])
        idle.start("127.0.0.1:0")
    if variant == "xds-remote":
        os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = bootstrap_json([remote], f"xds-native-cost-{os.getpid()}")
    try:
        if mode.startswith("sync"):
            import grpc
            ch = (native_sync(addrs) if variant.startswith("native")
                  else grpc.insecure_channel(f"xds:///{NAME}") if variant == "xds-remote"
                  else waypost.xds.channel(NAME, {NAME: direct}))
            try:
                qps, cpu = run_sync(ch, int(mode[4:]), seconds)
            finally:
                ch.close()
        else:
            import grpc.aio

            def make():
                if variant.startswith("native"):
                    return native_aio(addrs)
                if variant == "xds-remote":
                    return grpc.aio.insecure_channel(f"xds:///{NAME}")
                return waypost.xds.aio_channel(NAME, {NAME: direct})
            qps, cpu = asyncio.run(run_aio(make, int(mode[3:]), seconds))
    finally:
        if idle is not None:
            idle.stop()
    return {"qps": qps, "cpu_us": cpu * 1e6}


# -- the parent -----------------------------------------------------------------------------------------------

def _measure(variant: str, mode: str, seconds: float, addrs: list[str], remote: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", variant, mode, str(seconds), ",".join(addrs), remote],
                         check=False, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120 + seconds)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} {mode} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):9.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="sync1,sync8,aio64")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(ROOT / "bench/results/xds_native_cost.json"))
    ap.add_argument("--child", nargs=5, metavar=("VARIANT", "MODE", "SECONDS", "ADDRS", "REMOTE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        variant, mode, seconds, addrs, remote = args.child
        print(json.dumps(_child(variant, mode, float(seconds), addrs.split(","), remote)), flush=True)
        return 0

    from harness.backends.procs import spawn_many
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(sorted(unknown))}: choose from {', '.join(VARIANTS)}")
    procs = spawn_many(["s0", "s1", "s2"], workers=16)
    addrs = [p.address for p in procs]
    serve = subprocess.Popen([sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0",
                              "--export", f"{NAME}=direct:///" + ",".join(addrs)],
                             cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        if not line.startswith("xds: serving on "):
            raise RuntimeError(f"waypost xds serve did not start: {line!r}")
        remote = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        for mode in args.modes.split(","):
            per = results.setdefault(mode, {v: {"qps": [], "cpu_us": []} for v in variants})
            for r in range(args.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]  # rotate who goes first
                for v in order:
                    m = _measure(v, mode, args.seconds, addrs, remote)
                    per[v]["qps"].append(m["qps"])
                    per[v]["cpu_us"].append(m["cpu_us"])
                    print(f"{mode:6s} {v:10s} {m['qps']:9.0f} calls/s  {m['cpu_us']:6.1f} us CPU per call", flush=True)
    finally:
        serve.terminate()
        serve.wait(15)
        for p in procs:
            p.close()

    summary: dict[str, dict[str, object]] = {}
    print()
    for mode, per in results.items():
        s = summary.setdefault(mode, {})
        base = per.get("native")
        for v, m in per.items():
            row: dict[str, object] = {"qps": [round(x) for x in m["qps"]], "cpu_us": [round(x, 1) for x in m["cpu_us"]]}
            text = f"{mode:6s} {v:10s} calls/s {_spread(m['qps'])}  CPU us/call {_spread(m['cpu_us'])}"
            if base and v != "native":
                row["qps_ratio"] = statistics.median(m["qps"]) / statistics.median(base["qps"])
                row["cpu_ratio"] = statistics.median(m["cpu_us"]) / statistics.median(base["cpu_us"])
                text += f"  vs native: throughput {row['qps_ratio']:.3f}, CPU {row['cpu_ratio']:.3f}"
            s[v] = row
            print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "results": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
