"""Time to the first successful call when the first addresses are not gRPC servers, for every policy.

Target: ``direct:///BH,RESET,GARBAGE,A,B`` where BH accepts TCP connections and never answers (black hole),
RESET resets them, GARBAGE answers with bytes that are not HTTP/2, and A, B are in-process Echo servers.
For each policy and each client (sync ``waypost.dial``, aio ``waypost.aio.dial``), ``--runs`` fresh channels
each make one call with a ``--deadline`` second deadline (the policy named in the service config; a hash key
is set for consistent_hash); the time from dial to its answer is recorded
(``inf`` when it failed). Then, for pick_first, the failover case: the channel is in use on A, A is stopped,
and the time to the first successful call after that is recorded (the channel must get past BH again),
sync and aio.

Prints one line per (policy, client) with the median and max, and writes bench/results/first_call_past_black_hole.json.
Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import grpc

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.broken_listeners import broken_listeners
from harness.backends.server import EchoServer
from waypost.balancer.policies import known_policies

REQ = echo_pb2.EchoRequest(message="x")


def _config(policy: str) -> dict[str, object]:
    # through the service config (weighted_round_robin is gRPC's policy, as with balancer=)
    return {"loadBalancingConfig": [{policy: {}}]}


def _sync_first(target: str, policy: str, deadline: float) -> float:
    t0 = time.perf_counter()
    with waypost.dial(target, service_config=_config(policy)) as ch, waypost.hash_key("k"):
        try:
            echo_pb2_grpc.EchoStub(ch).Unary(REQ, timeout=deadline)
        except grpc.RpcError:
            return float("inf")
        return time.perf_counter() - t0


async def _aio_first(target: str, policy: str, deadline: float) -> float:
    t0 = time.perf_counter()
    async with waypost.aio.dial(target, service_config=_config(policy)) as ch:
        with waypost.hash_key("k"):
            try:
                await echo_pb2_grpc.EchoStub(ch).Unary(REQ, timeout=deadline)
            except grpc.RpcError:
                return float("inf")
        return time.perf_counter() - t0


def _failover(prefix: list[str], deadline: float) -> float:
    """pick_first in use on A; A stops; seconds to the next successful call (past the broken listeners)."""
    a, b = EchoServer("A").start(), EchoServer("B").start()
    try:
        target = "direct:///" + ",".join([*prefix, a.address, b.address])
        with waypost.dial(target, service_config=_config("pick_first")) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            stub.Unary(REQ, timeout=30, wait_for_ready=True)
            a.stop(0)
            t0 = time.perf_counter()
            end = t0 + deadline
            while time.perf_counter() < end:  # calls that land on A's dying connection fail at once: try again
                try:
                    stub.Unary(REQ, timeout=max(end - time.perf_counter(), 0.01))
                    return time.perf_counter() - t0
                except grpc.RpcError:
                    time.sleep(0.005)
            return float("inf")
    finally:
        a.stop(0)
        b.stop(0)


async def _aio_failover(prefix: list[str], deadline: float) -> float:
    """The same with an aio channel."""
    a, b = EchoServer("A").start(), EchoServer("B").start()
    try:
        target = "direct:///" + ",".join([*prefix, a.address, b.address])
        async with waypost.aio.dial(target, service_config=_config("pick_first")) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(REQ, timeout=30, wait_for_ready=True)
            a.stop(0)
            t0 = time.perf_counter()
            end = t0 + deadline
            while time.perf_counter() < end:
                try:
                    await stub.Unary(REQ, timeout=max(end - time.perf_counter(), 0.01))
                    return time.perf_counter() - t0
                except grpc.RpcError:
                    await asyncio.sleep(0.005)
            return float("inf")
    finally:
        a.stop(0)
        b.stop(0)


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(xs), "max_s": max(xs), "failed": sum(x == float("inf") for x in xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=5.0)
    ap.add_argument("--policies", default="", help="comma-separated (default: every registered policy)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "first_call_past_black_hole.json"))
    args = ap.parse_args()
    names = [p for p in args.policies.split(",") if p] or known_policies()
    results: dict[str, dict[str, object]] = {}
    with broken_listeners("black_hole", "reset", "garbage") as broken:
        prefix = [s.address for s in broken]
        a, b = EchoServer("A").start(), EchoServer("B").start()
        target = "direct:///" + ",".join([*prefix, a.address, b.address])
        try:
            for name in names:
                sync = [_sync_first(target, name, args.deadline) for _ in range(args.runs)]
                aio = [asyncio.run(_aio_first(target, name, args.deadline)) for _ in range(args.runs)]
                results[name] = {"sync": {"runs": sync, **_summary(sync)}, "aio": {"runs": aio, **_summary(aio)}}
                for kind, xs in (("sync", sync), ("aio", aio)):
                    s = _summary(xs)
                    print(f"{name:28s} {kind:4s} median {s['median_s']:.3f} s  max {s['max_s']:.3f} s"
                          f"  failed {s['failed']}/{len(xs)}", flush=True)
        finally:
            a.stop(0)
            b.stop(0)
        fo = [_failover(prefix, args.deadline) for _ in range(args.runs)]
        afo = [asyncio.run(_aio_failover(prefix, args.deadline)) for _ in range(args.runs)]
        results["pick_first failover"] = {"sync": {"runs": fo, **_summary(fo)}, "aio": {"runs": afo, **_summary(afo)}}
        for kind, xs in (("sync", fo), ("aio", afo)):
            s = _summary(xs)
            print(f"{'pick_first after A stops':28s} {kind:4s} median {s['median_s']:.3f} s  max {s['max_s']:.3f} s"
                  f"  failed {s['failed']}/{len(xs)}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"deadline_s": args.deadline, "results": results}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
