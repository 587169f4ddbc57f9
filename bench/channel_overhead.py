"""Per-call overhead of waypost's balanced channel vs grpcio's native round_robin, side by side.

The same 3 local Echo servers (subprocesses) are called through
  - waypost.dial("direct:///...", balancer="round_robin")            (and waypost.aio.dial)
  - grpc.insecure_channel("ipv4:127.0.0.1:p1,...", round_robin service config)  (and grpc.aio)
  - waypost.xds.channel("bench", {"bench": "direct:///..."}): the native path, gRPC's own xDS client fed by
    waypost's in-process control plane (and waypost.xds.aio_channel); skipped without the xds extra
in three modes: sync 1 thread, sync 8 threads, aio 64 tasks. Each (mode, impl) pair runs ``--rounds``
times, alternating implementations to spread machine noise; the best round counts.
Each measurement also reads the client's CPU time per call (this process; the servers are other processes),
which a shared machine's scheduling noise moves much less than throughput. Last lines: ``overhead <mode>:
waypost/native throughput = <ratio>`` and ``xds/native``. JSON: bench/results/channel_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import grpc
import grpc.aio

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many

RR = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
REQ = echo_pb2.EchoRequest(message="x")


def native_sync(addrs: list[str]) -> grpc.Channel:
    return grpc.insecure_channel("ipv4:" + ",".join(addrs), options=[("grpc.service_config", RR)])


def native_aio(addrs: list[str]) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel("ipv4:" + ",".join(addrs), options=[("grpc.service_config", RR)])


def run_sync(channel: grpc.Channel, threads: int, seconds: float) -> tuple[float, float]:
    """(calls per second, client CPU seconds per call)."""
    stub = echo_pb2_grpc.EchoStub(channel)
    for _ in range(50):  # warm every connection
        stub.Unary(REQ, timeout=30)
    counts = [0] * threads
    stop = time.perf_counter() + seconds
    start_gate = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        start_gate.wait()
        n = 0
        call = stub.Unary
        while time.perf_counter() < stop:
            call(REQ, timeout=30)
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    t0, c0 = time.perf_counter(), time.process_time()
    stop = t0 + seconds
    start_gate.wait()
    for t in ts:
        t.join()
    calls = sum(counts)
    return calls / (time.perf_counter() - t0), (time.process_time() - c0) / max(calls, 1)


async def run_aio(make, tasks: int, seconds: float) -> tuple[float, float]:
    """(calls per second, client CPU seconds per call)."""
    channel = make()
    try:
        stub = echo_pb2_grpc.EchoStub(channel)
        for _ in range(50):
            await stub.Unary(REQ, timeout=30)
        count = 0
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal count
            call = stub.Unary
            while time.perf_counter() < stop:
                await call(REQ, timeout=30)
                count += 1

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(tasks)))
        return count / (time.perf_counter() - t0), (time.process_time() - c0) / max(count, 1)
    finally:
        await channel.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="sync1,sync8,aio64", help="comma-separated subset of sync1,sync8,aio64")
    ap.add_argument("--impls", default="native,waypost,xds", help="comma-separated subset of native,waypost,xds")
    ap.add_argument("--out", default=str(ROOT / "bench/results/channel_overhead.json"))
    args = ap.parse_args()
    impls = [i for i in args.impls.split(",") if i]
    if "xds" in impls:
        try:
            importlib.import_module("waypost.xds")
        except ImportError as e:
            print(f"skipping xds (pip install 'waypost[xds]'): {e}", flush=True)
            impls.remove("xds")

    procs = spawn_many(["s0", "s1", "s2"], workers=16)
    addrs = [p.address for p in procs]
    direct = "direct:///" + ",".join(addrs)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for mode in args.modes.split(","):
            results[mode] = {k: [] for i in impls for k in (i, i + "_cpu")}
            for _ in range(args.rounds):
                for impl in impls:
                    if mode.startswith("sync"):
                        threads = int(mode[4:])
                        ch = (waypost.dial(direct, balancer="round_robin") if impl == "waypost"
                              else waypost.xds.channel("bench", {"bench": direct}) if impl == "xds"
                              else native_sync(addrs))
                        try:
                            qps, cpu = run_sync(ch, threads, args.seconds)
                        finally:
                            ch.close()
                    else:
                        def make(impl=impl):
                            if impl == "waypost":
                                return waypost.aio.dial(direct, balancer="round_robin")
                            if impl == "xds":
                                return waypost.xds.aio_channel("bench", {"bench": direct})
                            return native_aio(addrs)
                        qps, cpu = asyncio.run(run_aio(make, 64, args.seconds))
                    results[mode][impl].append(qps)
                    results[mode][impl + "_cpu"].append(cpu)
                    print(f"{mode:6s} {impl:8s} {qps:9.0f} calls/s  {cpu * 1e6:6.1f} us client CPU per call", flush=True)
    finally:
        for p in procs:
            p.close()

    summary: dict[str, dict[str, object]] = {}
    for mode, r in results.items():
        s: dict[str, object] = summary.setdefault(mode, {})
        for impl in impls:
            s[f"{impl}_qps"] = r[impl]
            s[f"{impl}_cpu_us_per_call"] = [round(c * 1e6, 1) for c in r[impl + "_cpu"]]
        if "native" in impls:
            for impl, key in (("waypost", ""), ("xds", "xds_")):
                if impl in impls:  # "ratio" / "cpu_ratio": waypost/native; "xds_ratio" / "xds_cpu_ratio": xds/native
                    s[f"{key}ratio"] = max(r[impl]) / max(r["native"])
                    s[f"{key}cpu_ratio"] = min(r[impl + "_cpu"]) / min(r["native_cpu"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "results": summary}, indent=2))
    # CPU per call (this process: the client) is steadier than throughput on a shared machine
    for key, impl in (("", "waypost"), ("xds_", "xds")):
        for mode, s in summary.items():
            if f"{key}cpu_ratio" in s:
                print(f"client CPU per call {mode}: {impl}/native = {s[f'{key}cpu_ratio']:.3f}")
    for key, impl in (("", "waypost"), ("xds_", "xds")):
        for mode, s in summary.items():
            if f"{key}ratio" in s:
                print(f"overhead {mode}: {impl}/native throughput = {s[f'{key}ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
