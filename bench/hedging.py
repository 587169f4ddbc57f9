"""Hedging (``hedgingPolicy``) against a tail of slow calls: no hedging vs a fixed hedging delay vs the adaptive
``"hedgingDelay": "p95"``, each with waypost's default cap on extra calls (``maxExtraShare`` 0.05).

Two parts, both run by default:

- ``sim``: a 100-way fan-out (a request is 100 parallel calls and is done when all 100 are) over a fleet where each
  call is slow (``--slow-factor`` x, 10 by default) with probability ``--slow-share`` (1 %). The hedging decisions
  are waypost's own (``waypost.client.hedging``: ``HedgePlan``, ``ExtraShare``, ``LatencyQuantile``) driven on a
  simulated clock, one event queue for all calls. Reports the fan-out's p50/p99/p99.9 and the extra calls (hedges
  as a share of calls).
- ``real``: real Echo servers in subprocesses (``--backends`` of them, 10), one of which answers a call slowly
  (``--slow-ms`` instead of ``--fast-ms``: 200 ms and 20 ms, long enough that this 2-core machine's scheduling
  stalls do not drown them) with probability ``--real-slow-share`` (1 %); a ``waypost.aio.dial``
  client runs ``--real-requests`` fan-outs of ``--real-fanout`` calls each for each mode, bounded by
  ``--real-seconds`` per mode. Reports the same figures, measured, and how many calls a slow attempt answered
  (the tail hedging left; a slow fan-out without one is the machine's scheduling, not the backends).

Prints the ratios as its last lines (p99.9 and p99 of each hedged mode over no hedging, and its extra calls); JSON
to bench/results/hedging.json. On a loaded machine the real part's p99.9 (the 2nd-worst of 2,000 fan-outs) moves
with scheduling stalls as much as with hedging: read several runs, and the p99 beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from waypost.client.hedging import ChannelHedging
from waypost.service_config import parse_service_config

SERVICE = "waypost.test.Echo"


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))]


def summary(latencies: list[float], calls: int, hedges: int) -> dict[str, float]:
    s = sorted(latencies)
    return {"p50_ms": quantile(s, 0.5) * 1000, "p99_ms": quantile(s, 0.99) * 1000,
            "p999_ms": quantile(s, 0.999) * 1000, "requests": len(s), "calls": calls, "hedges": hedges,
            "extra_pct": 100.0 * hedges / calls if calls else 0.0}


def hedging_policy(mode: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``hedgingPolicy`` JSON of a mode (None: no hedging)."""
    if mode == "none":
        return None
    return {"maxAttempts": args.max_attempts, "hedgingDelay": args.fixed_delay if mode == "fixed" else mode}


def service_config(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = {"loadBalancingConfig": [{"round_robin": {}}]}
    policy = hedging_policy(mode, args)
    if policy is not None:
        cfg["methodConfig"] = [{"name": [{"service": SERVICE}], "hedgingPolicy": policy}]
    return cfg


# ---- simulation --------------------------------------------------------------------------------------------


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """``args.requests`` fan-outs one after another on a simulated clock; waypost's HedgePlan decides the hedges."""
    rng = random.Random(args.seed)
    cfg = parse_service_config(service_config(mode, args))
    mc = cfg.method_config(f"/{SERVICE}/Unary")
    clock = SimClock()
    method = ChannelHedging(None, clock).for_method(f"/{SERVICE}/Unary", mc.hedging_policy if mc else None)

    def latency() -> float:
        base = args.base_ms / 1000 * rng.lognormvariate(0.0, args.sigma)
        return base * args.slow_factor if rng.random() < args.slow_share else base

    out: list[float] = []
    calls = hedges = 0
    for _ in range(args.requests):
        start = clock.now
        plans = []
        events: list[tuple[float, int, int, str]] = []  # (time, seq, call, "done" | "check")
        seq = 0
        for i in range(args.fanout):
            calls += 1
            events.append((start + latency(), seq, i, "done"))
            seq += 1
            if method is not None:
                plan = method.plan()
                plans.append(plan)
                w = plan.wait()
                if w is not None:
                    events.append((start + w, seq, i, "check"))
                    seq += 1
        heapq.heapify(events)
        done = [False] * args.fanout
        left = args.fanout
        end = start
        while left:
            t, _, i, kind = heapq.heappop(events)
            clock.now = t
            if done[i]:
                continue
            if kind == "done":
                done[i] = True
                left -= 1
                end = t
                if plans:
                    plans[i].succeeded()
                continue
            plan = plans[i]
            w = plan.wait()
            if w is None:
                continue
            if w > 0:
                heapq.heappush(events, (t + w, seq, i, "check"))
            elif plan.admit():
                hedges += 1
                heapq.heappush(events, (t + latency(), seq, i, "done"))
                seq += 1
                w = plan.wait()
                if w is not None:
                    heapq.heappush(events, (t + w, seq, i, "check"))
            seq += 1
        out.append(end - start)
        clock.now = end + args.gap_ms / 1000
    return summary(out, calls, hedges)


# ---- real processes ------------------------------------------------------------------------------------------

_SERVER = '''
import random, sys, threading, time
from concurrent import futures
import grpc
from harness.backends import echo_pb2, echo_pb2_grpc
fast, slow, share, seed = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000, float(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
lock = threading.Lock()
class Echo(echo_pb2_grpc.EchoServicer):
    def Unary(self, request, context):
        with lock:
            s = rng.random() < share
        time.sleep(slow if s else fast)
        return echo_pb2.EchoReply(message=request.message, server="slow" if s else "")
server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=[("grpc.so_reuseport", 0)])
echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print("PORT", port, flush=True)
sys.stdin.read()
server.stop(0)
'''


class Backend:
    """A real Echo server process (this bench's own servicer: slow with a given probability)."""

    def __init__(self, fast_ms: float, slow_ms: float, slow_share: float, seed: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(fast_ms), str(slow_ms), str(slow_share),
                                      str(seed)], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"bench server did not start: {line!r}")
        self.address = f"127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


async def run_real(mode: str, addresses: list[str], args: argparse.Namespace) -> dict[str, float]:
    import waypost.aio
    from harness.backends import echo_pb2, echo_pb2_grpc

    cfg = service_config(mode, args)
    async with waypost.aio.dial("direct:///" + ",".join(addresses), service_config=cfg) as ch:
        t_end = time.monotonic() + 30
        while len(ch.balancer.ready_addresses()) < len(addresses) and time.monotonic() < t_end:
            await asyncio.sleep(0.02)
        stub = echo_pb2_grpc.EchoStub(ch)
        req = echo_pb2.EchoRequest(message="x")
        for _ in range(args.real_warmup):  # warm-up fan-outs: connections, and the adaptive delay's first samples
            await asyncio.gather(*(stub.Unary(req, timeout=10) for _ in range(args.real_fanout)))
        share = ch.config.hedging.share
        calls0, hedges0 = share.calls, share.hedges
        out: list[float] = []
        stop = time.monotonic() + args.real_seconds
        n = 0
        slow_answers = 0  # calls answered by a slow attempt: tails hedging did not cut (the rest is the machine)
        while n < args.real_requests and time.monotonic() < stop:
            t0 = time.perf_counter()
            replies = await asyncio.gather(*(stub.Unary(req, timeout=10) for _ in range(args.real_fanout)))
            out.append(time.perf_counter() - t0)
            slow_answers += sum(r.server == "slow" for r in replies)
            n += 1
        calls = n * args.real_fanout
        hedges = share.hedges - hedges0 if mode != "none" else 0
        if mode != "none":
            assert share.calls - calls0 == calls
        return {**summary(out, calls, hedges), "slow_answers": slow_answers}


def real(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    backends: list[Backend] = []
    try:
        for k in range(args.backends):
            slow_share = args.real_slow_share if k == 0 else 0.0
            backends.append(Backend(args.fast_ms, args.slow_ms, slow_share, args.seed + k))
        addresses = [b.address for b in backends]
        return {mode: asyncio.run(run_real(mode, addresses, args)) for mode in modes(args)}
    finally:
        for b in backends:
            b.stop()


def modes(args: argparse.Namespace) -> list[str]:
    """none, fixed, then each adaptive quantile."""
    return ["none", "fixed", *args.adaptive.split(",")]


def report(name: str, results: dict[str, dict[str, float]], say: Callable[[str], None]) -> None:
    for mode, r in results.items():
        say(f"{name} {mode:6s}: p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  p99.9 {r['p999_ms']:7.2f} ms  "
            f"extra calls {r['extra_pct']:5.2f} % ({r['requests']} requests, {r['calls']} calls)"
            + (f", {r['slow_answers']} answered slowly" if "slow_answers" in r else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sim", "real", "both"), default="both")
    ap.add_argument("--fixed-delay", default="0.03s", help="hedgingDelay of the fixed mode (sim and real)")
    ap.add_argument("--adaptive", default="p95,p98", help="the adaptive modes: their hedgingDelay quantiles")
    ap.add_argument("--max-attempts", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    sim = ap.add_argument_group("simulation")
    sim.add_argument("--requests", type=int, default=5000, help="fan-outs per mode")
    sim.add_argument("--fanout", type=int, default=100)
    sim.add_argument("--base-ms", type=float, default=20.0, help="median of a normal call")
    sim.add_argument("--sigma", type=float, default=0.2, help="lognormal spread of a normal call")
    sim.add_argument("--slow-share", type=float, default=0.01)
    sim.add_argument("--slow-factor", type=float, default=10.0)
    sim.add_argument("--gap-ms", type=float, default=1.0, help="simulated time between fan-outs")
    rp = ap.add_argument_group("real processes")
    rp.add_argument("--backends", type=int, default=10)
    rp.add_argument("--fast-ms", type=float, default=20.0)
    rp.add_argument("--slow-ms", type=float, default=200.0)
    rp.add_argument("--real-slow-share", type=float, default=0.01, help="share of the slow backend's calls")
    rp.add_argument("--real-fanout", type=int, default=10)
    rp.add_argument("--real-requests", type=int, default=2000)
    rp.add_argument("--real-seconds", type=float, default=75.0, help="bound per mode")
    rp.add_argument("--real-warmup", type=int, default=20, help="fan-outs before measuring")
    ap.add_argument("--out", default=str(ROOT / "bench/results/hedging.json"))
    args = ap.parse_args()

    results: dict[str, Any] = {}
    lines: list[str] = []
    if args.part in ("sim", "both"):
        results["sim"] = {mode: simulate(mode, args) for mode in modes(args)}
        report("sim ", results["sim"], print)
    if args.part in ("real", "both"):
        results["real"] = real(args)
        report("real", results["real"], print)
    for part, r in results.items():
        base = r["none"]["p999_ms"]
        hedged = [m for m in r if m != "none"]
        base99 = r["none"]["p99_ms"]
        lines.append(f"hedging {part}: p99.9 vs none: " + ", ".join(f"{m} {r[m]['p999_ms'] / base:.3f}" for m in hedged)
                     + "; p99 vs none: " + ", ".join(f"{m} {r[m]['p99_ms'] / base99:.3f}" for m in hedged)
                     + "; extra calls: " + ", ".join(f"{m} {r[m]['extra_pct']:.2f} %" for m in hedged))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results, "load": os.getloadavg()}, indent=2))
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
