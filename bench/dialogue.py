"""Palantir dialogue's client-balancing scenarios, played with real gRPC servers and waypost clients.

dialogue (Palantir's Java HTTP client) publishes a simulation of its balancing strategies: per scenario, the
success rate and mean latency of each strategy (``simulation/src/test/resources/report.md`` in its repository).
This bench plays the scenarios that map onto gRPC with real ``grpc.aio`` servers on loopback, whose behaviour
changes on dialogue's schedule (a status code, a latency, a finite capacity, a black hole), and ``waypost.aio``
channels as the clients, once per policy; it prints each scenario's success rate and mean latency per policy beside
dialogue's best strategy's published figures and writes them to ``bench/results/dialogue.json``.

Run: ``python bench/dialogue.py`` (a few minutes), ``--quick`` (the default policy and round_robin, half the calls),
``--policies peak_ewma,round_robin``, ``--scenarios black_hole,short_outage_on_one_node``; a policy name ending in
``+limit`` (``peak_ewma+limit``) turns its adaptive concurrency limit on (``concurrencyLimit``, its defaults).

Mapping (dialogue -> gRPC): HTTP 500 -> INTERNAL (not retried, as dialogue does not), 503 -> UNAVAILABLE and
429 -> RESOURCE_EXHAUSTED (retried: a ``retryPolicy`` with dialogue's 4 retries and its 250 ms backoff slot, scaled),
400 -> INVALID_ARGUMENT. A server's latency is drawn when the call arrives (dialogue's ``linearResponseTime``: the
best case plus best case x in flight / capacity, 5x beyond capacity). A black hole accepts calls and never
answers; the calls carry a deadline ending at dialogue's ``abortAfter``, and, as dialogue's ``client_mean`` counts
only the responses received, a call ending in DEADLINE_EXCEEDED counts as a failure and not in the mean.

Real calls per second stay at or below ~150 (the clients share a loaded 2-core machine: a client loop that cannot
keep up sends late, reported as ``send_lag_s``). Time is compressed by each scenario's factor ``f`` (durations,
latencies and schedules x f, request rates / f); with a rate factor ``r`` the rates are x r, and so is the number
of clients, so that each client sends at dialogue's rate per client and sees what a dialogue client sees, while the
servers carry r of dialogue's load. The latencies printed are divided by f, in dialogue's seconds, as is
``floor``: the mean latency of a call to a server that answers at once, measured before each run (the loopback RPC
cost in every latency here; dialogue's simulation has none). What is not compressed: the policies' own time
constants (peak_ewma's 10 s decay; the failure penalty's 10 s memory and its 1-16 s trial intervals), which
therefore span more of a compressed scenario than they would of dialogue's.

Not played: ``slowdown_and_error_thresholds`` and the ``server_side_rate_limits*`` scenarios (minutes to hours of
queueing behind dialogue's client-side limiter, or sticky channels: nothing in a gRPC balancer maps onto them).
Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import grpc
import grpc.aio

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from waypost.orca.load_interceptor import AsyncLoadInterceptor
from waypost.service_config.model import DEFAULT_POLICY

OK = grpc.StatusCode.OK
INTERNAL = grpc.StatusCode.INTERNAL  # HTTP 500
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE  # HTTP 503
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED  # HTTP 429
INVALID = grpc.StatusCode.INVALID_ARGUMENT  # HTTP 400
SERVICE = "waypost.test.Echo"
FOREVER = 1e9  # dialogue's one-day black hole
FLOOR_CALLS = 50


@dataclass(frozen=True)
class Phase:
    """What a server does from dialogue time ``at`` (seconds) on."""

    at: float = 0.0
    code: grpc.StatusCode = OK
    latency: float = 0.0  # dialogue seconds (the best case with ``capacity``)
    capacity: int | None = None  # linearResponseTime's capacity
    error_capacity: tuple[grpc.StatusCode, int] | None = None  # respond200UntilCapacity: this code beyond
    fail_rate: float = 0.0  # respond500AtRate
    per_method: dict[str, grpc.StatusCode] | None = None  # an endpoint (request message) -> its code


@dataclass(frozen=True)
class Server:
    name: str
    phases: tuple[Phase, ...]
    begin_at: float = 0.0  # dialogue seconds: registered then (live reloading)


@dataclass(frozen=True)
class Best:
    """dialogue's best strategy in its published report (highest success, then lowest mean)."""

    strategy: str
    success: float  # percent
    mean: float  # seconds


@dataclass(frozen=True)
class Scenario:
    name: str
    servers: tuple[Server, ...]
    rate: float  # dialogue requests per second (all clients)
    duration: float  # dialogue seconds of sending
    clients: int
    best: Best
    f: float = 1.0  # time factor
    r: float = 1.0  # rate factor
    deadline: float | None = None  # dialogue seconds (abortAfter - sendUntil)
    endpoints: tuple[str, ...] = ("e",)
    burst: int | None = None  # send this many calls at once instead of a rate (one_big_spike)
    play: float | None = None  # dialogue seconds actually sent, when shorter than ``duration`` (a steady scenario)


def _s(name: str, *phases: Phase, begin_at: float = 0.0) -> Server:
    return Server(name, tuple(phases), begin_at)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("simplest_possible_case",
             (_s("fast", Phase(latency=0.6)), _s("medium", Phase(latency=0.8)), _s("slightly_slow", Phase(latency=1.0))),
             rate=11, duration=1200, clients=10, f=0.2, r=1.0, play=50,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 100.0, 0.785757575)),
    Scenario("slow_503s_then_revert",
             (_s("fast", Phase(latency=0.06, capacity=60)),
              _s("slow_failures_then_revert", Phase(latency=0.06, capacity=60),
                 Phase(at=3, code=UNAVAILABLE, latency=1.0, capacity=60), Phase(at=10, latency=0.06, capacity=60))),
             rate=200, duration=15, clients=10, f=0.5, r=0.3,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 100.0, 0.088828705)),
    Scenario("fast_503s_then_revert",
             (_s("normal", Phase(latency=0.12)),
              _s("fast_503s_then_revert", Phase(latency=0.12), Phase(at=3, code=UNAVAILABLE, latency=0.0),
                 Phase(at=60, latency=0.12))),
             rate=500, duration=90, clients=10, f=0.1, r=0.03,
             best=Best("CONCURRENCY_LIMITER_PIN_UNTIL_ERROR", 100.0, 0.120012009)),
    Scenario("fast_400s_then_revert",
             (_s("normal", Phase(latency=0.12)),
              _s("fast_400s_then_revert", Phase(latency=0.12), Phase(at=3, code=INVALID, latency=0.02),
                 Phase(at=30, latency=0.12))),
             rate=100, duration=60, clients=10, f=0.1, r=0.15,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 93.6, 0.113583333)),
    Scenario("short_outage_on_one_node",
             (_s("stable", Phase(latency=2.0)),
              _s("has_short_outage", Phase(latency=2.0), Phase(at=30, code=INTERNAL, latency=0.0),
                 Phase(at=50, latency=2.0))),
             rate=20, duration=80, clients=1, f=0.1, r=0.75,
             best=Best("CONCURRENCY_LIMITER_PIN_UNTIL_ERROR", 99.8, 18.248406257)),
    Scenario("drastic_slowdown",
             (_s("fast", Phase(latency=0.06, capacity=60)),
              _s("fast_then_slow_then_fast", Phase(latency=0.06, capacity=60), Phase(at=3, latency=10.0, capacity=60),
                 Phase(at=10, latency=0.06, capacity=60))),
             rate=200, duration=20, clients=10, f=0.25, r=0.18,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 100.0, 0.251969999)),
    Scenario("all_nodes_500",
             (_s("node1", Phase(code=INTERNAL, latency=0.6), Phase(at=10, latency=0.6)),
              _s("node2", Phase(code=INTERNAL, latency=0.6), Phase(at=10, latency=0.6))),
             rate=100, duration=20, clients=10, f=0.25, r=0.35,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 74.1, 3.347395)),
    Scenario("black_hole",
             (_s("node1", Phase(latency=0.6)),
              _s("node2_black_hole", Phase(latency=0.6), Phase(at=3, latency=FOREVER))),
             rate=200, duration=10, clients=10, f=0.25, r=0.18, deadline=20.0,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 91.5, 0.600005464)),
    Scenario("one_endpoint_dies_on_each_server",
             (_s("server_where_e1_breaks", Phase(latency=0.6), Phase(at=3, latency=0.6, per_method={"e1": INTERNAL})),
              _s("server_where_e2_breaks", Phase(latency=0.6), Phase(at=3, latency=0.6, per_method={"e2": INTERNAL}))),
             rate=250, duration=10, clients=10, f=0.25, r=0.15, endpoints=("e1", "e2"),
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 66.2, 2.0278288)),
    Scenario("live_reloading",
             (_s("always_on", Phase(latency=0.6, capacity=60)),
              _s("always_broken", Phase(code=INTERNAL, latency=0.6, capacity=60)),
              _s("added_halfway", Phase(latency=0.6, capacity=60), begin_at=5.0)),
             rate=250, duration=10, clients=10, f=0.25, r=0.15,
             best=Best("CONCURRENCY_LIMITER_PIN_UNTIL_ERROR", 94.3, 7.1919248)),
    Scenario("uncommon_flakes",
             (_s("fast0", Phase(latency=0.000001, fail_rate=0.01)), _s("fast1", Phase(latency=0.000001, fail_rate=0.01))),
             rate=1000, duration=10, clients=10, f=1.0, r=0.15, play=5,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 99.0, 0.000001)),
    Scenario("one_big_spike",
             (_s("node1", Phase(latency=0.15, error_capacity=(EXHAUSTED, 100))),
              _s("node2", Phase(latency=0.15, error_capacity=(EXHAUSTED, 100)))),
             rate=30_000, duration=0.0, clients=1, f=1.0, burst=1000,
             best=Best("CONCURRENCY_LIMITER_ROUND_ROBIN", 100.0, 1.579726259)),
)


class ScheduledEcho(echo_pb2_grpc.EchoServicer):
    """An Echo server whose status, latency and capacity follow a dialogue server's schedule (time x f)."""

    def __init__(self, spec: Server, t0: float, f: float, rng: random.Random) -> None:
        self.spec = spec
        self.t0 = t0
        self.f = f
        self.rng = rng
        self.inflight = 0
        self.calls = 0

    def _phase(self) -> Phase:
        now = (time.monotonic() - self.t0) / self.f
        current = self.spec.phases[0]
        for p in self.spec.phases:
            if p.at <= now:
                current = p
        return current

    async def Unary(self, request: Any, context: Any) -> Any:
        self.inflight += 1
        self.calls += 1
        try:
            p = self._phase()
            code = p.code
            if p.per_method is not None:
                code = p.per_method.get(request.message, code)
            if p.error_capacity is not None and self.inflight > p.error_capacity[1]:
                code = p.error_capacity[0]
            if p.fail_rate and self.rng.random() < p.fail_rate:
                code = INTERNAL
            latency = p.latency
            if p.capacity is not None:  # dialogue's linearResponseTime
                queued = self.inflight - 1
                latency = 5 * latency if queued > p.capacity else latency + latency * queued / p.capacity
            if latency >= FOREVER:
                await asyncio.Event().wait()  # a black hole: until the caller gives up
            if latency > 0:
                await asyncio.sleep(latency * self.f)
            if code is not OK:
                await context.abort(code, f"{self.spec.name}: {code.name}")
            return echo_pb2.EchoReply(message=request.message, server=self.spec.name)
        finally:
            self.inflight -= 1


def clients_of(sc: Scenario, scale: float) -> int:
    """dialogue's clients x the rate factor (x ``scale``): each client sends at dialogue's rate per client (as near
    as whole clients allow), so what one client's picker sees (its calls in flight, how many calls it sends before
    a failure comes back) is dialogue's."""
    return max(1, round(sc.clients * sc.r * scale))


LIMIT_SUFFIX = "+limit"  # a policy variant with its adaptive concurrency limit on (``concurrencyLimit``, defaults)


def _service_config(policy: str, f: float) -> dict[str, Any]:
    # dialogue retries 503 and 429 (4 retries, exponential backoff from a 250 ms slot), not 500
    name, limited = policy.removesuffix(LIMIT_SUFFIX), policy.endswith(LIMIT_SUFFIX)
    return {"loadBalancingConfig": [{name: {"concurrencyLimit": {}} if limited else {}}],
            "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
                "maxAttempts": 5, "initialBackoff": f"{max(0.001, 0.25 * f):.3f}s",
                "maxBackoff": f"{max(0.01, 4.0 * f):.3f}s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}}]}


@dataclass
class Result:
    scenario: str
    policy: str
    sent: int = 0
    ok: int = 0
    codes: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # dialogue seconds, calls answered (not timed out)
    server_calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    floor: float = 0.0  # dialogue seconds: a call to a server that answers at once (``_floor``)
    lag: float = 0.0  # dialogue seconds: how late the latest call was sent (the client's loop was busy)

    @property
    def success(self) -> float:
        return 100.0 * self.ok / self.sent if self.sent else 0.0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies) if self.latencies else float("nan")

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "policy": self.policy, "sent": self.sent, "ok": self.ok,
                "success_pct": round(self.success, 2), "mean_s": round(self.mean, 6),
                "p50_s": round(self.quantile(0.5), 6), "p99_s": round(self.quantile(0.99), 6), "codes": self.codes,
                "server_attempts": self.server_calls, "wall_s": round(self.seconds, 2),
                "floor_s": round(self.floor, 6), "send_lag_s": round(self.lag, 4)}


async def _serve(conn: Connection, sc: Scenario, seed: int) -> None:
    """The servers' process: ``sc``'s servers and a zero-latency one (the loopback floor), their addresses sent on
    ``conn``; then time 0 received, the schedules run until "stop", and each server's attempts sent back."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    servers: list[tuple[grpc.aio.Server, ScheduledEcho]] = []
    addresses: list[str] = []
    for spec in (*sc.servers, _s("floor", Phase())):
        srv = grpc.aio.server(interceptors=[AsyncLoadInterceptor()])
        svc = ScheduledEcho(spec, time.monotonic(), sc.f, rng)
        echo_pb2_grpc.add_EchoServicer_to_server(svc, srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        servers.append((srv, svc))
        addresses.append(f"127.0.0.1:{port}")
    conn.send(addresses)
    t0 = await loop.run_in_executor(None, conn.recv)
    for _, svc in servers:
        svc.t0 = t0
    await loop.run_in_executor(None, conn.recv)  # "stop"
    conn.send({svc.spec.name: svc.calls for _, svc in servers[:-1]})
    for srv, _ in servers:
        await srv.stop(0)


def _serve_process(conn: Connection, sc: Scenario, seed: int) -> None:
    asyncio.run(_serve(conn, sc, seed))


async def _floor(address: str) -> float:
    """Mean seconds of a call to a server that answers at once, through waypost (sequential): the part of every
    latency measured here that is loopback RPC cost on this machine now, not the scenario."""
    async with waypost.aio.dial(f"direct:///{address}") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        await stub.Unary(echo_pb2.EchoRequest(), timeout=20, wait_for_ready=True)
        times = []
        for _ in range(FLOOR_CALLS):
            t = time.perf_counter()
            await stub.Unary(echo_pb2.EchoRequest(), timeout=20)
            times.append(time.perf_counter() - t)
    return statistics.fmean(times)


async def play(sc: Scenario, policy: str, scale: float, seed: int) -> Result:
    """One run of ``sc`` with ``policy`` (``scale``: a further rate factor, for --quick). The
    servers run in a child process (their own event loop and cores' share), the clients here."""
    f = sc.f
    conn, child_conn = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=_serve_process, args=(child_conn, sc, seed),
                                                        daemon=True)
    child.start()
    loop = asyncio.get_running_loop()
    result = Result(sc.name, policy)
    channels: list[Any] = []
    publishers: dict[str, Any] = {}
    try:
        if not await loop.run_in_executor(None, conn.poll, 60):
            raise RuntimeError("the servers' process did not start within 60 s")
        addresses = conn.recv()
        result.floor = await _floor(addresses[-1]) / f
        registry_name = f"dialogue{os.getpid()}x{seed}x{time.monotonic_ns()}"
        registry = waypost.connect(f"memory://{registry_name}")
        publishers = {spec.name: waypost.Publisher(registry, "dialogue.rpc", addr)
                      for spec, addr in zip(sc.servers, addresses, strict=False)}
        for spec in sc.servers:
            if spec.begin_at == 0.0:
                await asyncio.to_thread(publishers[spec.name].start)
        target = f"memory://{registry_name}/?key=dialogue.rpc"
        cfg = _service_config(policy, f)
        channels = [waypost.aio.dial(target, service_config=cfg) for _ in range(clients_of(sc, scale))]
        stubs = [echo_pb2_grpc.EchoStub(ch) for ch in channels]
        first = sum(1 for s in sc.servers if s.begin_at == 0.0)
        give_up = time.monotonic() + 20
        # connected before time 0 (dialogue's channels exist before its first request)
        while any(len(ch.balancer.ready_addresses()) < first for ch in channels) and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        t0 = time.monotonic() + 0.05  # CLOCK_MONOTONIC: the same clock in the servers' process
        conn.send(t0)
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        timeout = None if sc.deadline is None else sc.deadline * f
        pending: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            # call i goes out on client i % clients; each client alternates between the endpoints
            req = echo_pb2.EchoRequest(message=sc.endpoints[(i // len(stubs)) % len(sc.endpoints)])
            start = time.perf_counter()
            try:
                await stubs[i % len(stubs)].Unary(req, timeout=timeout)
                code = OK
            except grpc.aio.AioRpcError as e:
                code = e.code()
            result.codes[code.name] = result.codes.get(code.name, 0) + 1
            if code is OK:
                result.ok += 1
            if code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                result.latencies.append((time.perf_counter() - start) / f)

        if sc.burst is not None:
            total, interval = sc.burst, 0.0
        else:
            rate = sc.rate * sc.r * scale / f  # real calls per second
            total = max(1, int(sc.rate * sc.r * scale * (sc.play or sc.duration)))
            interval = 1.0 / rate
        joins = sorted((s.begin_at * f + t0, s.name) for s in sc.servers if s.begin_at > 0.0)
        for i in range(total):
            due = t0 + i * interval
            while joins and joins[0][0] <= due:
                await asyncio.to_thread(publishers[joins.pop(0)[1]].start)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                result.lag = max(result.lag, -delay / f)
            t = asyncio.ensure_future(one(i))
            pending.add(t)
            t.add_done_callback(pending.discard)
        result.sent = total
        if pending:
            await asyncio.wait(pending)
        result.seconds = time.monotonic() - t0
        conn.send("stop")
        if await loop.run_in_executor(None, conn.poll, 30):
            result.server_calls = conn.recv()
    finally:
        for ch in channels:
            await ch.close()
        for pub in publishers.values():
            await asyncio.to_thread(pub.stop)
        if child.is_alive():
            with contextlib.suppress(Exception):
                conn.send("stop")
            child.join(10)
        if child.is_alive():
            child.terminate()
            child.join(5)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the default policy and round_robin, half the rate and clients")
    ap.add_argument("--policies", help="comma-separated policies (default: peak_ewma, least_request, prequal, "
                                       "round_robin)")
    ap.add_argument("--scenarios", help="comma-separated scenario names (default: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dialogue.json"))
    args = ap.parse_args(argv)
    if args.policies:
        policies = args.policies.split(",")
    elif args.quick:
        policies = [DEFAULT_POLICY, "round_robin"]
    else:
        policies = [DEFAULT_POLICY, "least_request", "prequal", "round_robin"]
    names = {s.name for s in SCENARIOS}
    chosen = args.scenarios.split(",") if args.scenarios else [s.name for s in SCENARIOS]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}: choose from {sorted(names)}")
    scale = 0.5 if args.quick else 1.0
    rows: list[dict[str, Any]] = []
    print(f"{'scenario':34} {'policy':14} {'success':>8} {'mean s':>8} {'floor s':>8}   dialogue's best: success, mean "
          f"(strategy)")
    for sc in SCENARIOS:
        if sc.name not in chosen:
            continue
        for policy in policies:
            res = asyncio.run(play(sc, policy, scale, args.seed))
            row = res.as_json()
            row["dialogue_best"] = {"strategy": sc.best.strategy, "success_pct": sc.best.success,
                                    "mean_s": sc.best.mean}
            row["time_factor"], row["rate_factor"] = sc.f, sc.r
            rows.append(row)
            print(f"{sc.name:34} {policy:14} {res.success:7.1f}% {res.mean:8.3f} {res.floor:8.3f}   {sc.best.success:.1f}%, "
                  f"{sc.best.mean:.3f} ({sc.best.strategy})  attempts {res.server_calls} codes {res.codes}",
                  flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "seed": args.seed, "load": os.getloadavg(), "runs": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
