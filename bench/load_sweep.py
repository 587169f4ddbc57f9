"""Load sweep: tail latency of each balancing policy against finite-capacity backends, vs an oracle.

Backends are real gRPC Echo servers, one subprocess each (this script with ``--backend``): ``slots``
calls are served at once, the rest wait in a FIFO queue; service times are exponential with a given
mean, drawn from a seeded generator (re-seeded before every run, so each policy meets the same
sequence of service times). Each backend also mounts the load reports, ``waypost.load.v1`` and ORCA, as
``waypost.serve`` does (``waypost.orca.mount``), and reports ``application_utilization`` = calls being served
or waiting / slots (``waypost.set_load``): sleeping handlers use no CPU, so CPU utilization alone would not say
how full a backend is. Scenarios:

  slow        4 backends x 2 slots, 4 ms mean; one of them 40 ms (10x slower)
  hetero      4 backends with 1:2:4:8 slots, 4 ms mean (registered with no weights)
  hetero_weighted  the same fleet registered with weights 1:2:4:8 (its capacities; through a memory registry)
  antagonist  4 backends x 4 slots, 4 ms mean; one drops to 2 slots half-way through each run
  hetero248   3 backends with 2/4/8 slots, 40 ms mean (350 calls/s in all: an open loop one Python client can
              drive at 95 %)

Load: closed loops of ``--callers`` sync threads (each sends its next call when the previous one
ends), and one grpc.aio run per scenario with ``--aio-callers`` concurrent coroutines. Policies:
waypost's round_robin, least_request, p2c_ewma, peak_ewma and prequal (those registered), grpcio's
native round_robin, ``smooth_weighted_round_robin`` (registration weights; round robin where none are registered),
``weighted_round_robin`` (gRPC's A58 over per-call ORCA reports) and ``weighted_round_robin_oob`` (the same over
out-of-band reports every 0.2 s), both with ``blackoutPeriod`` 0.5 s and ``weightUpdatePeriod`` 0.2 s (gRPC's
10 s blackout would outlast a run),
``default`` (``waypost.dial`` without a balancer) and the ``oracle``: a
dispatcher that knows the truth -- smooth weighted round robin with weights = true capacity
(slots / mean service time; the slow backend gets weight 0, the antagonist's victim half its weight
from the moment it loses half its slots).

Lines: ``sweep <scenario> c=<C>: p99 <policy>/oracle = <r>`` (aio runs: scenario ``<scenario>/aio``),
last ``sweep worst: p99 default/oracle = <r>``. JSON to bench/results/load_sweep.json.
``--utils 80,90``: open loops instead (``run_open``): Poisson arrivals at u % of the fleet's true capacity from one
grpc.aio client, each call its own task, latency counted from when the call was due; each policy and the oracle at
each u, in the same run. Lines ``sweep <scenario>/open u=<U>%: p99 <policy>/oracle = <r>``.
``--quick``: callers 4 only, short runs, no aio (under 2 minutes on an idle 2-core machine).
``--probe-cost``: no sweep; the client CPU of one prequal load-report probe beside that of one balanced call
(sequential, against one backend subprocess), and the probe rate that keeps probes at 3 % of the client CPU
at 1,000 calls/s (how prequal's default ``maxProbeRate`` was chosen).
The figures move with the machine's load: Python servers and clients share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import grpc

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from waypost.balancer.policies import POLICIES

REQ = echo_pb2.EchoRequest(message="x")
RR = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
ALL_POLICIES = ["round_robin", "native_round_robin", "smooth_weighted_round_robin", "weighted_round_robin",
                "weighted_round_robin_oob", "least_request", "p2c_ewma", "peak_ewma", "prequal", "default", "oracle"]
#: sweep labels dialled with a service config rather than ``balancer=``
A58 = {"blackoutPeriod": "0.5s", "weightUpdatePeriod": "0.2s"}
SERVICE_CONFIGS: dict[str, dict[str, Any]] = {
    "weighted_round_robin": {"loadBalancingConfig": [{"weighted_round_robin": A58}]},
    "weighted_round_robin_oob": {"loadBalancingConfig": [{"weighted_round_robin": {
        **A58, "enableOobLoadReport": True, "oobReportingPeriod": "0.2s"}}]},
}
ORCA_MIN_INTERVAL = 0.2  # the backends' floor for out-of-band report intervals


def dial_args(policy: str) -> dict[str, Any]:
    """How ``waypost.dial`` is called for a sweep label."""
    if policy in SERVICE_CONFIGS:
        return {"service_config": SERVICE_CONFIGS[policy]}
    return {"balancer": None if policy == "default" else policy}
CALL_TIMEOUT = 20.0  # seconds per call
MAX_CALLS_PER_CALLER = 1_000_000  # every loop is bounded by count as well as time


# ---------------------------------------------------------------------------------------- backends


class Slots:
    """``limit`` calls at once; the others wait (FIFO: Condition wakes its oldest waiter first)."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self._limit = limit
        self._busy = 0

    def acquire(self, timeout: float) -> bool:
        with self._cond:
            self.waiting += 1
            ok = self._cond.wait_for(lambda: self._busy < self._limit, timeout)
            self.waiting -= 1
            if ok:
                self._busy += 1
            return ok

    def release(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify()

    def fullness(self) -> float:
        """Calls being served or waiting, over the slots (the backend's application_utilization)."""
        return (self._busy + self.waiting) / self._limit

    waiting = 0

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self._limit = limit
            self._cond.notify_all()


class SlotEcho(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str, slots: int, mean: float, seed: int) -> None:
        self.name = name
        self.slots = Slots(slots)
        self.mean = mean
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()

    def configure(self, slots: int, seed: int) -> None:
        self.slots.set_limit(slots)
        with self.rng_lock:
            self.rng.seed(seed)

    def Unary(self, request: Any, context: Any) -> Any:
        with self.rng_lock:
            service = self.rng.expovariate(1.0 / self.mean)
        if not self.slots.acquire(CALL_TIMEOUT):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queued too long")
        try:
            time.sleep(service)
        finally:
            self.slots.release()
        return echo_pb2.EchoReply(message=request.message, server=self.name)


def backend_main(args: argparse.Namespace) -> int:
    """Child process: a slot-limited Echo server. stdin lines ``set <slots> <seed>``; EOF: exit."""
    from waypost import orca

    servicer = SlotEcho(args.name, args.slots, args.mean_ms / 1000.0, args.seed)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128))
    echo_pb2_grpc.add_EchoServicer_to_server(servicer, server)
    orca.configure(min_interval=ORCA_MIN_INTERVAL)
    orca.mount(server)
    waypost.set_load(servicer.slots.fullness)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    deadline = time.monotonic() + args.max_seconds
    for line in sys.stdin:  # ends when the parent closes our stdin or dies
        parts = line.split()
        if len(parts) == 3 and parts[0] == "set":
            servicer.configure(int(parts[1]), int(parts[2]))
            print("OK", flush=True)
        if time.monotonic() > deadline:
            break
    server.stop(0).wait(5)
    return 0


class BackendProcess:
    def __init__(self, name: str, slots: int, mean_ms: float, seed: int, max_seconds: float) -> None:
        self.name = name
        cmd = [sys.executable, __file__, "--backend", "--name", name, "--slots", str(slots),
               "--mean-ms", str(mean_ms), "--seed", str(seed), "--max-seconds", str(max_seconds)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._readline()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"backend {name} did not start (got {line!r})")
        self.address = f"127.0.0.1:{int(line.split()[1])}"
        self._lock = threading.Lock()

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def configure(self, slots: int, seed: int) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(f"set {slots} {seed}\n")
            self.proc.stdin.flush()
            if self._readline().strip() != "OK":
                raise RuntimeError(f"backend {self.name} did not acknowledge its configuration")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# --------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    name: str
    slots: list[int]
    mean_ms: list[float]
    victim: int | None = None  # antagonist: this backend loses half its slots half-way through
    registered: list[int] | None = None  # registration metadata ``weight`` of each backend (None: none)

    def weights(self, halved: bool) -> list[float]:
        """True capacity of each backend (calls per second); the 10x slower backend counts as 0."""
        fastest = min(self.mean_ms)
        w = [s / m * 1000 if m < 5 * fastest else 0.0 for s, m in zip(self.slots, self.mean_ms)]
        if halved and self.victim is not None:
            w[self.victim] /= 2
        return w


SCENARIOS = {
    "slow": Scenario("slow", [2, 2, 2, 2], [4, 4, 4, 40]),
    "hetero": Scenario("hetero", [1, 2, 4, 8], [4, 4, 4, 4]),
    "hetero_weighted": Scenario("hetero_weighted", [1, 2, 4, 8], [4, 4, 4, 4], registered=[1, 2, 4, 8]),
    "antagonist": Scenario("antagonist", [4, 4, 4, 4], [4, 4, 4, 4], victim=0),
    "hetero248": Scenario("hetero248", [2, 4, 8], [40, 40, 40]),
}


class Oracle:
    """Smooth weighted round robin (nginx's) over per-backend channels with the true capacities."""

    def __init__(self, weights: Callable[[], list[float]], n: int) -> None:
        self._weights = weights
        self._current = [0.0] * n
        self._lock = threading.Lock()

    def next(self) -> int:
        w = self._weights()
        total = sum(w)
        with self._lock:
            best = 0
            for i, wi in enumerate(w):
                self._current[i] += wi
                if self._current[i] > self._current[best]:
                    best = i
            self._current[best] -= total
            return best


# --------------------------------------------------------------------------------------------- runs


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))]


def summarize(latencies: list[float], served: dict[str, int], errors: int) -> dict[str, Any]:
    values = sorted(latencies)
    return {"calls": len(values), "errors": errors, "p50_ms": percentile(values, 0.5) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
            "mean_ms": statistics.fmean(values) * 1000 if values else float("nan"), "share": served}


def sync_caller_factory(policy: str, addrs: list[str], oracle: Oracle,
                        target: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(call, close): ``call()`` sends one call through ``policy`` and returns the reply."""
    if policy == "oracle":
        chans = [grpc.insecure_channel(a) for a in addrs]
        for c in chans:  # connected before the clock starts, like a balanced channel after warm-up
            grpc.channel_ready_future(c).result(timeout=30)
        stubs = [echo_pb2_grpc.EchoStub(c) for c in chans]
        return (lambda: stubs[oracle.next()].Unary(REQ, timeout=CALL_TIMEOUT)), lambda: [c.close() for c in chans]
    if policy == "native_round_robin":
        ch = grpc.insecure_channel("ipv4:" + ",".join(addrs), options=[("grpc.service_config", RR)])
    else:
        ch = waypost.dial(target, **dial_args(policy))
    stub = echo_pb2_grpc.EchoStub(ch)
    return (lambda: stub.Unary(REQ, timeout=CALL_TIMEOUT)), ch.close


def run_sync(policy: str, addrs: list[str], oracle: Oracle, callers: int, warmup: float, seconds: float,
             at_half: Callable[[], None], target: str) -> dict[str, Any]:
    call, close = sync_caller_factory(policy, addrs, oracle, target)
    lat: list[list[float]] = [[] for _ in range(callers)]
    served: list[dict[str, int]] = [{} for _ in range(callers)]
    errors = [0] * callers
    start = time.perf_counter()
    record_from, stop = start + warmup, start + warmup + seconds

    def worker(i: int) -> None:
        mine, where = lat[i], served[i]
        for _ in range(MAX_CALLS_PER_CALLER):
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            try:
                r = call()
            except grpc.RpcError:
                errors[i] += 1
                continue
            if t0 >= record_from:
                mine.append(time.perf_counter() - t0)
                where[r.server] = where.get(r.server, 0) + 1

    half = threading.Timer(warmup + seconds / 2, at_half)
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
    try:
        half.start()
        for t in ts:
            t.start()
        for t in ts:
            t.join(warmup + seconds + CALL_TIMEOUT + 10)
    finally:
        half.cancel()
        close()
    return summarize([v for part in lat for v in part], merge(served), sum(errors))


def merge(parts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


async def run_aio(policy: str, addrs: list[str], oracle: Oracle, callers: int, warmup: float, seconds: float,
                  at_half: Callable[[], None], target: str) -> dict[str, Any]:
    if policy == "oracle":
        chans: list[Any] = [grpc.aio.insecure_channel(a) for a in addrs]
        for c in chans:  # connected before the clock starts, like a balanced channel after warm-up
            await asyncio.wait_for(c.channel_ready(), 30)
        stubs = [echo_pb2_grpc.EchoStub(c) for c in chans]

        def send() -> Any:
            return stubs[oracle.next()].Unary(REQ, timeout=CALL_TIMEOUT)
    else:
        if policy == "native_round_robin":
            chans = [grpc.aio.insecure_channel("ipv4:" + ",".join(addrs), options=[("grpc.service_config", RR)])]
        else:
            chans = [waypost.aio.dial(target, **dial_args(policy))]
        stub = echo_pb2_grpc.EchoStub(chans[0])

        def send() -> Any:
            return stub.Unary(REQ, timeout=CALL_TIMEOUT)

    lat: list[float] = []
    served: dict[str, int] = {}
    errors = 0
    start = time.perf_counter()
    record_from, stop = start + warmup, start + warmup + seconds

    async def worker() -> None:
        nonlocal errors
        for _ in range(MAX_CALLS_PER_CALLER):
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            try:
                r = await send()
            except grpc.RpcError:
                errors += 1
                continue
            if t0 >= record_from:
                lat.append(time.perf_counter() - t0)
                served[r.server] = served.get(r.server, 0) + 1

    loop = asyncio.get_running_loop()
    half = loop.call_later(warmup + seconds / 2, lambda: loop.run_in_executor(None, at_half))
    try:
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(callers))),
                               warmup + seconds + CALL_TIMEOUT + 10)
    finally:
        half.cancel()
        for c in chans:
            await c.close()
    return summarize(lat, dict(sorted(served.items())), errors)


async def run_open(policy: str, addrs: list[str], oracle: Oracle, rate: float, warmup: float, seconds: float,
                   target: str, seed: int) -> dict[str, Any]:
    """Open loop: calls arrive as a Poisson process of ``rate`` per second (seeded), whatever the replies do; each
    runs as its own task on one grpc.aio channel (the oracle: one per backend)."""
    if policy == "oracle":
        chans: list[Any] = [grpc.aio.insecure_channel(a) for a in addrs]
        for c in chans:
            await asyncio.wait_for(c.channel_ready(), 30)
        stubs = [echo_pb2_grpc.EchoStub(c) for c in chans]

        def send() -> Any:
            return stubs[oracle.next()].Unary(REQ, timeout=CALL_TIMEOUT)
    else:
        chans = [waypost.aio.dial(target, **dial_args(policy))]
        stub = echo_pb2_grpc.EchoStub(chans[0])

        def send() -> Any:
            return stub.Unary(REQ, timeout=CALL_TIMEOUT)

    lat: list[float] = []
    served: dict[str, int] = {}
    errors = 0
    rng = random.Random(seed)
    start = time.perf_counter()
    record_from, stop = start + warmup, start + warmup + seconds

    async def one(t0: float) -> None:
        nonlocal errors
        try:
            r = await send()
        except grpc.RpcError:
            errors += 1
            return
        if t0 >= record_from:
            lat.append(time.perf_counter() - t0)
            served[r.server] = served.get(r.server, 0) + 1

    tasks = []
    due = start
    for _ in range(int(rate * (warmup + seconds) * 2) + 10):  # bounded by count as well as time
        due += rng.expovariate(rate)
        if due >= stop:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(due)))  # latency from when the call was due: a late send counts
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT + 10)
    finally:
        for c in chans:
            await c.close()
    return summarize(lat, dict(sorted(served.items())), errors)


def open_loop_scenario(sc: Scenario, policies: list[str], utils: list[int], warmup: float, seconds: float,
                       seed: int, max_seconds: float) -> list[dict[str, Any]]:
    """Each policy under open-loop load at each ``u`` % of the fleet's true capacity, the oracle in the same run."""
    procs: list[BackendProcess] = []
    try:
        for i, (slots, mean) in enumerate(zip(sc.slots, sc.mean_ms)):
            procs.append(BackendProcess(f"{sc.name}{i}", slots, mean, seed + i, max_seconds))
        addrs = [p.address for p in procs]
        target, publishers = registered_target(sc, addrs)
        capacity = sum(sc.weights(False))
        rows, run = [], 0
        for u in utils:
            label = f"{sc.name}/open"
            results: dict[str, dict[str, Any]] = {}
            for policy in policies:
                run += 1
                for i, p in enumerate(procs):
                    p.configure(sc.slots[i], seed * 1000 + run * 10 + i)
                oracle = Oracle(lambda: sc.weights(False), len(addrs))
                r = asyncio.run(run_open(policy, addrs, oracle, capacity * u / 100, warmup, seconds, target,
                                         seed * 1000 + u))
                results[policy] = r
                print(f"  {label:16s} u={u:<3d} {policy:20s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                      f"calls {r['calls']:6d}  errors {r['errors']}  share {r['share']}", flush=True)
            oracle_p99 = results["oracle"]["p99_ms"]
            ratios = {p: r["p99_ms"] / oracle_p99 for p, r in results.items() if p != "oracle"}
            for p, ratio in ratios.items():
                print(f"sweep {label} u={u}%: p99 {p}/oracle = {ratio:.3f}", flush=True)
            rows.append({"scenario": label, "util": u, "rate": capacity * u / 100, "results": results,
                         "p99_over_oracle": ratios})
        for pub in publishers:
            pub.stop()
        return rows
    finally:
        for p in procs:
            p.close()


def sweep_scenario(sc: Scenario, policies: list[str], callers: list[int], aio_callers: int, warmup: float,
                   seconds: float, seed: int, max_seconds: float) -> list[dict[str, Any]]:
    procs: list[BackendProcess] = []
    publishers: list[Any] = []
    try:
        for i, (slots, mean) in enumerate(zip(sc.slots, sc.mean_ms)):
            procs.append(BackendProcess(f"{sc.name}{i}", slots, mean, seed + i, max_seconds))
        addrs = [p.address for p in procs]
        target, publishers = registered_target(sc, addrs)
        halved = threading.Event()

        def reset(run: int) -> None:
            halved.clear()
            for i, p in enumerate(procs):
                p.configure(sc.slots[i], seed * 1000 + run * 10 + i)

        def at_half() -> None:
            if sc.victim is not None:
                procs[sc.victim].configure(max(1, sc.slots[sc.victim] // 2), seed)
                halved.set()

        rows = []
        plan = [(c, False) for c in callers] + ([(aio_callers, True)] if aio_callers > 0 else [])
        run = 0
        for c, aio in plan:
            label = f"{sc.name}/aio" if aio else sc.name
            results: dict[str, dict[str, Any]] = {}
            for policy in policies:
                run += 1
                reset(run)
                oracle = Oracle(lambda: sc.weights(halved.is_set()), len(addrs))
                if aio:
                    r = asyncio.run(run_aio(policy, addrs, oracle, c, warmup, seconds, at_half, target))
                else:
                    r = run_sync(policy, addrs, oracle, c, warmup, seconds, at_half, target)
                results[policy] = r
                print(f"  {label:16s} c={c:<3d} {policy:20s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                      f"calls {r['calls']:6d}  errors {r['errors']}  share {r['share']}", flush=True)
            oracle_p99 = results["oracle"]["p99_ms"] if "oracle" in results else float("nan")
            ratios = {p: r["p99_ms"] / oracle_p99 for p, r in results.items() if p != "oracle"}
            for p, ratio in ratios.items():
                print(f"sweep {label} c={c}: p99 {p}/oracle = {ratio:.3f}", flush=True)
            rows.append({"scenario": label, "callers": c, "aio": aio, "results": results,
                         "p99_over_oracle": ratios})
        return rows
    finally:
        for pub in publishers:
            pub.stop()
        for p in procs:
            p.close()


def registered_target(sc: Scenario, addrs: list[str]) -> tuple[str, list[Any]]:
    """The target waypost's channels dial: the addresses as they are, or (``registered`` weights) registrations
    carrying them in an in-process memory registry; and the publishers to stop afterwards."""
    if sc.registered is None:
        return "direct:///" + ",".join(addrs), []
    name = f"load-sweep-{sc.name}-{time.monotonic_ns()}"
    registry = waypost.connect(f"memory://{name}")
    publishers = [waypost.Publisher(registry, "sweep.rpc", a, metadata={"weight": w}).start()
                  for a, w in zip(addrs, sc.registered)]
    return f"memory://{name}/?key=sweep.rpc", publishers


def probe_cost(n: int, rounds: int) -> int:
    """Client CPU per probe: rounds of ``n`` sequential calls on a peak_ewma channel and on a prequal channel
    probing at every pick (no rate cap) over the same 4 backends; the difference over the probes sent."""
    procs = [BackendProcess(f"cost{i}", 64, 0.001, i, 600) for i in range(4)]  # ~1 us service: the client's cost
    try:
        target = "direct:///" + ",".join(p.address for p in procs)
        plain = waypost.dial(target, balancer="peak_ewma")
        probing = waypost.dial(target, service_config={"loadBalancingConfig": [
            {"prequal": {"probesPerPick": 1, "maxProbeRate": 1e6}}]})
        default = waypost.dial(target, balancer="prequal")  # its default probe rate cap
        policy = probing.config.policy
        stubs = [echo_pb2_grpc.EchoStub(plain), echo_pb2_grpc.EchoStub(probing), echo_pb2_grpc.EchoStub(default)]
        for stub in stubs:
            for _ in range(200):
                stub.Unary(REQ, timeout=CALL_TIMEOUT)
        per_call, per_probe, ratio, overhead = [], [], [], []
        for _ in range(rounds):
            cpu = []
            sent = policy.probes_sent
            for stub in stubs:
                t0 = time.process_time()
                for _ in range(n):
                    stub.Unary(REQ, timeout=CALL_TIMEOUT)
                cpu.append(time.process_time() - t0)
            probes = policy.probes_sent - sent
            per_call.append(cpu[0] / n)
            per_probe.append((cpu[1] - cpu[0]) / max(1, probes))
            ratio.append(probes / n)
            overhead.append(cpu[2] / cpu[0] - 1)
        for ch in (plain, probing, default):
            ch.close()
    finally:
        for p in procs:
            p.close()
    call_us, probe_us = statistics.median(per_call) * 1e6, statistics.median(per_probe) * 1e6
    print(f"probe cost: {probe_us:.0f} us client CPU per probe (rounds: "
          f"{', '.join(f'{v * 1e6:.0f}' for v in per_probe)}), {call_us:.0f} us per peak_ewma call, "
          f"{statistics.median(ratio):.2f} probes per call; medians of {rounds} x {n} calls")
    print(f"probe cost: default prequal channel, client CPU per call vs peak_ewma: "
          f"{', '.join(f'{v * 100:+.1f} %' for v in overhead)} (pick, probes and answers; sequential calls, "
          f"so at ~1/latency calls/s)")
    budget = 0.03 * 1000 * call_us  # us of client CPU per second
    print(f"probe cost: 3 % of the client CPU at 1,000 calls/s = {budget / 1000:.1f} ms/s "
          f"= {budget / max(probe_us, 1e-9):.0f} probes/s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    ap.add_argument("--callers", default="2,4,8,16,32", help="comma-separated closed-loop thread counts")
    ap.add_argument("--aio-callers", type=int, default=16, help="coroutines of the aio run (0: no aio run)")
    ap.add_argument("--policies", default=",".join(ALL_POLICIES),
                    help="comma-separated; unregistered waypost policies are skipped (oracle is always run)")
    ap.add_argument("--utils", default="",
                    help="comma-separated %% of the fleet's true capacity: open-loop runs (Poisson arrivals, one "
                         "grpc.aio client) instead of the closed loops")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured time per run")
    ap.add_argument("--warmup", type=float, default=1.5, help="unmeasured load before each measurement")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="callers 4, 1 s runs, no aio (a smoke test)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/load_sweep.json"))
    ap.add_argument("--probe-cost", action="store_true", help="measure a probe's client CPU instead of sweeping")
    ap.add_argument("--backend", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--slots", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--mean-ms", type=float, default=4.0, help=argparse.SUPPRESS)
    ap.add_argument("--max-seconds", type=float, default=3600.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.backend:
        return backend_main(args)
    if args.probe_cost:
        return probe_cost(2000, 5)
    if args.quick:
        args.callers, args.aio_callers, args.seconds, args.warmup = "4", 0, 1.0, 0.5

    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    bad = [p for p in args.policies.split(",") if p not in ALL_POLICIES]
    if bad:
        ap.error(f"unknown policy name(s) {bad}; choose from {ALL_POLICIES}")
    wanted = [p for p in args.policies.split(",")
              if p in ("native_round_robin", "default") or p in POLICIES or p in SERVICE_CONFIGS]
    skipped = [p for p in args.policies.split(",") if p not in wanted and p != "oracle"]
    if skipped:
        print(f"(not registered in this waypost, skipped: {', '.join(skipped)})")
    policies = [*dict.fromkeys([*wanted, "oracle"])]
    callers = [int(c) for c in args.callers.split(",") if c]
    if any(c < 1 for c in callers):
        ap.error("--callers: every count must be >= 1")
    default_name = _default_policy_name()
    print(f"policies: {', '.join(policies)} (default = {default_name})", flush=True)

    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    budget = 3600.0 + len(callers) * len(policies) * (args.seconds + args.warmup) * 10
    utils = [int(u) for u in args.utils.split(",") if u]
    for name in args.scenarios.split(","):
        if utils:
            rows += open_loop_scenario(SCENARIOS[name], [p for p in policies if p != "native_round_robin"], utils,
                                       args.warmup, args.seconds, args.seed, budget)
            continue
        rows += sweep_scenario(SCENARIOS[name], policies, callers, args.aio_callers, args.warmup, args.seconds,
                               args.seed, budget)
    defaults = [r["p99_over_oracle"]["default"] for r in rows if "default" in r["p99_over_oracle"]]
    worst = max(defaults) if defaults else float("nan")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "default_policy": default_name, "rows": rows,
                               "worst_default_over_oracle": worst, "elapsed_s": time.monotonic() - t0},
                              indent=2))
    print(f"sweep worst: p99 default/oracle = {worst:.3f}")
    return 0


def _default_policy_name() -> str:
    """The policy ``waypost.dial`` uses without a balancer (read from the client's configuration)."""
    from waypost.service_config import DEFAULT_POLICY

    return str(DEFAULT_POLICY)


if __name__ == "__main__":
    raise SystemExit(main())
