#!/usr/bin/env python3
"""Deterministic discrete-event simulation of client-side load balancing policies.

N backends, each with a number of concurrent slots (calls beyond that queue, FIFO), a lognormal
service time and optionally a share of calls that fail fast; Poisson arrivals from one or more
clients; a per-call deadline (the client gives up: DEADLINE_EXCEEDED at the deadline, the call stays
queued/in service on the backend, as a cancelled gRPC call does until the server notices). The real
waypost pickers are driven through ``Policy.build`` / ``Picker.pick`` / ``done(Outcome)`` with the
simulation clock injected as the policy clock. No threads, no sleeping; everything is seeded.

Each simulated server keeps a real ``waypost.orca.LoadAccount`` on the simulation clock, fed
as the server's load interceptor feeds it: ``begin`` when a call reaches the server (a queued call
counts as in flight: the real handler runs while it waits for a slot), ``end`` when it finishes (or
when a call whose deadline passed leaves the queue). ``prequal`` gets a simulated prober: a probe
reads the server's ``snapshot()`` ``PROBE_DELAY`` after it is sent and the answer reaches the policy
(``on_probe``) ``PROBE_DELAY`` later. Calls themselves reach the server at pick time.

Scenarios (1 client each)
  slow_backend   1 of 4 backends is 10x slower throughout
  degrading      all equal, then one backend becomes 10x slower half-way through
  heterogeneous  slot counts 1:2:4:8 (registered weights = capacities, which smooth_weighted_round_robin uses)
  flapping       one backend fails 30% of its calls, failing fast
  cold_start     3 backends, a 4th joins after a third of the run and serves its first ``COLD_CALLS`` calls
                 ``COLD_FACTOR`` x slower (cold caches, a JIT); measured from its arrival. Printed twice for
                 least_request, p2c_ewma, peak_ewma and prequal: as configured by default, and with
                 ``slowStartWindow`` = ``SLOW_START`` (``cold_start <policy>: ...`` lines)

Utilization sweep (``SWEEP_CLIENTS`` clients, each with its own policy instance, sharing 50 backends,
starting at random times over ``SWEEP_STAGGER``; offered load u x the fleet's true capacity; a warm-up
of ``SWEEP_WARMUP`` seconds, not measured, then ``--sweep-duration`` seconds measured; ``--fleets`` picks some)
  slow_tenth      50 backends x 4 slots x 10 ms, 5 of them 5x slower (50 ms)
  hetero_cap      50 backends with 2, 4 or 8 slots (about a third each) x 10 ms, no weights registered
  noisy_neighbour 50 x 4 slots x 10 ms; 5 of them at half capacity for the middle 40 % of the run (u is of the
                  capacity meanwhile; the oracle's weights follow)
  bursty          hetero_cap's backends, arrivals on/off (``BURSTS``: 1.6x the mean rate, then 0.4x, 50 ms each)
  bimodal         50 x 4 slots, 10 ms mean: a tenth of the calls 10x slower than the rest (``BIMODAL``)
  few_clients     hetero_cap's backends, ``FEW_CLIENTS`` clients
  many_clients    5 backends with 8/16/32/16/8 slots x 10 ms, ``MANY_CLIENTS`` clients
  no_reports      hetero_cap, servers without load reports (no call trailer; probes answer UNIMPLEMENTED)
A call that ends at its server (not at its deadline) carries the server's ``call_load`` trailer when the pick asked
for it. Each point also reports the backends' utilization, max and average (busy slot-time over the measured window).
The sweep runs ``SWEEP_POLICIES``: random and smooth_weighted_round_robin are left out (unweighted, they split as
round_robin does).

Policies: round_robin, random, smooth_weighted_round_robin, least_request, p2c_ewma, peak_ewma, prequal,
``default`` (the policy ``waypost.service_config.DEFAULT_POLICY`` names, read at run time) and
``oracle``: round_robin over the set without the bad backend; for heterogeneous, where no single
backend is bad, weighted round robin by true capacity, and in the sweep weighted round robin with
weights = true capacity (slots / mean service time).

Usage: python bench/simulate.py [--quick] [--seed N] [--duration S] [--sweep-duration S]
                                [--no-sweep | --sweep-only] [--out PATH]
Sweep lines: ``util <fleet> u=<U>%: p99 <policy>/oracle = <r>, backend utilization max/avg = <M>%/<A>%``
(``default`` included; ``--quick``: u = ``QUICK_UTILS`` only), a table of
them, then the policies ranked by their worst ratio, ties by the geometric mean over the sweep
(``util rank <n>: <policy> worst p99/oracle = <r> (<fleet> u=<U>%), geomean <g>``) and where the
default stands (``util default = <policy>: worst p99/oracle = <r> (...), geomean <g>``).
The last lines, one per scenario: ``<scenario>: p99 p2c_ewma/round_robin = R, p2c_ewma/oracle = R``
(with ``--sweep-only``: the sweep's ranking lines).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from waypost.balancer.base import Outcome, PickInfo, Policy
from waypost.balancer.policies import get_policy
from waypost.orca import call_load
from waypost.orca.account import LoadAccount
from waypost.service_config import DEFAULT_POLICY
from waypost.types import Backend

POLICIES = ["round_robin", "random", "smooth_weighted_round_robin", "least_request", "p2c_ewma", "peak_ewma",
            "prequal", "default", "oracle"]
#: the sweep leaves out random and smooth_weighted_round_robin: with no weights registered they split as round_robin
#: does (random with more variance), and the sweep's wall time is what bounds how many fleets it can cover
SWEEP_POLICIES = [p for p in POLICIES if p not in ("random", "smooth_weighted_round_robin")]
DEADLINE = 1.0  # seconds: the client's per-call deadline
SIGMA = 0.5  # lognormal shape of service times
#: seconds, one way, client <-> server, for load-report probes only: a probe reads the server's account this long
#: after it is sent and its answer reaches the policy as long again later (a same-zone round trip of 0.5 ms; the
#: constant is the only network the simulation has: no variance, no loss, calls themselves arrive at pick time)
PROBE_DELAY = 0.00025
COLD_CALLS = 100  # cold_start: the newcomer's first calls that are slow
COLD_FACTOR = 30.0  # ... this many times slower than its warm service time
SLOW_START = "10s"  # cold_start: the slowStartWindow of the second run of the ramping policies
SLOW_START_POLICIES = ("least_request", "p2c_ewma", "peak_ewma", "prequal")

SWEEP_UTILS = (30, 50, 70, 80, 90, 95)  # offered load, % of the fleet's true capacity
QUICK_UTILS = (50, 80, 95)  # ... with --quick
SWEEP_CLIENTS = 20
SWEEP_BACKENDS = 50
#: seconds of each sweep run not measured (full run, --quick): every client starts knowing nothing
SWEEP_WARMUP = (1.0, 0.25)
#: seconds: the sweep's clients start at uniform random times over this span. Clients that all start at the same
#: instant stay in lockstep with a deterministic rotation (smooth_weighted_round_robin, the oracle): the k-th pick of every
#: client goes to the same backend at about the same time, a burst no real fleet of clients produces
SWEEP_STAGGER = 0.2
NOISY = (0.3, 0.7)  # noisy_neighbour: fractions of the run when 5 backends lose half their capacity, get it back
BURSTS = (0.1, 1.6, 0.4)  # bursty: period (s), rate factor on, off (the mean stays u)
BIMODAL = (0.1, 10.0)  # bimodal: a tenth of the calls 10x slower than the others (the mean stays 10 ms)
FEW_CLIENTS = 2
MANY_CLIENTS = 100


@dataclass
class BackendSpec:
    address: str
    slots: int
    mean: float  # mean service time, seconds
    fail_prob: float = 0.0
    fail_latency: float = 0.001
    weight: int | None = None  # registered metadata weight
    cold_calls: int = 0  # the first calls this backend serves are ``cold_factor`` x slower
    cold_factor: float = 1.0

    @property
    def capacity(self) -> float:
        """Calls per second this backend completes when saturated."""
        return self.slots / self.mean

    @property
    def kind(self) -> str:
        return f"{self.slots}x{self.mean * 1e3:g}ms"


@dataclass
class Scenario:
    name: str
    description: str
    backends: list[BackendSpec]
    rate: float  # arrivals per second, all clients together
    bad: str | None  # removed for the oracle
    slowdown: tuple[float, str, float] | None = None  # (fraction of the run, address, factor)
    oracle_weights: dict[str, int] | None = None  # the oracle is weighted round robin with these weights
    clients: int = 1  # each with its own policy instance and picker; arrivals split evenly
    warmup: float = 0.0  # seconds: calls arriving earlier are not measured
    stagger: float = 0.0  # seconds: each client's first call comes at a uniform random time in [0, stagger)
    #: (fraction of the run, address): that backend joins then (every client's policy rebuilds) and the measurement
    #: starts then; before it, the policies see the others only (the oracle never sees it: it is ``bad``)
    join: tuple[float, str] | None = None
    #: capacity changes: (fraction of the run, addresses, factor): their mean service time is multiplied by factor
    #: then (the oracle's weights follow: it knows the truth)
    changes: tuple[tuple[float, tuple[str, ...], float], ...] = ()
    #: on/off arrivals: (period in seconds, rate factor in the first half, in the second half); the mean is kept
    bursts: tuple[float, float, float] | None = None
    #: bimodal service times: (share of slow calls, slow / fast mean); every backend's mean is kept
    bimodal: tuple[float, float] | None = None
    reports: bool = True  # False: the servers have no load-report service (probes answer UNIMPLEMENTED)


def scenarios() -> list[Scenario]:
    def equal(n: int = 4) -> list[BackendSpec]:
        return [BackendSpec(f"10.0.0.{i + 1}:8080", slots=8, mean=0.010) for i in range(n)]

    slow = equal()
    slow[3].mean = 0.100
    flap = equal()
    flap[3].fail_prob = 0.30
    cold = equal()
    cold[3].cold_calls, cold[3].cold_factor = COLD_CALLS, COLD_FACTOR
    hetero = [
        BackendSpec(f"10.0.0.{i + 1}:8080", slots=2 * c, mean=0.010, weight=c) for i, c in enumerate((1, 2, 4, 8))
    ]
    return [
        Scenario("slow_backend", "1 of 4 backends 10x slower (8 slots x 10 ms each, 1200 rps)", slow, 1200.0,
                 bad=slow[3].address),
        Scenario("degrading", "one of 4 backends becomes 10x slower half-way (1200 rps)", equal(), 1200.0,
                 bad="10.0.0.4:8080", slowdown=(0.5, "10.0.0.4:8080", 10.0)),
        Scenario("heterogeneous", "slots 2:4:8:16 x 10 ms (capacities 1:2:4:8), 1800 rps = 60% of capacity",
                 hetero, 1800.0, bad=None, oracle_weights={b.address: b.slots for b in hetero}),
        Scenario("flapping", "one of 4 backends fails 30% of calls in 1 ms (1200 rps)", flap, 1200.0,
                 bad=flap[3].address),
        Scenario("cold_start", f"3 backends, a 4th joins after 1/3 of the run, its first {COLD_CALLS} calls "
                 f"{COLD_FACTOR:g}x slower (1200 rps); measured from then", cold, 1200.0, bad=cold[3].address,
                 join=(1 / 3, cold[3].address)),
    ]


def _address(i: int) -> str:
    return f"10.1.{i // 250}.{i % 250 + 1}:8080"


@dataclass(frozen=True)
class SweepFleet:
    """One fleet of the utilization sweep: its backends and how it is driven."""

    description: str
    backends: list[BackendSpec]
    clients: int = SWEEP_CLIENTS
    changes: tuple[tuple[float, tuple[str, ...], float], ...] = ()
    bursts: tuple[float, float, float] | None = None
    bimodal: tuple[float, float] | None = None
    reports: bool = True

    def capacity(self) -> float:
        """Calls per second the fleet completes when saturated, at its lowest (while its neighbours are noisy):
        u is a share of what the fleet can always serve."""
        now: dict[str, float] = {}  # address -> its service time factor so far
        slowest: dict[str, float] = {}
        for _, addrs, f in sorted(self.changes):
            for a in addrs:
                now[a] = now.get(a, 1.0) * f
                slowest[a] = max(slowest.get(a, 1.0), now[a])
        return sum(b.capacity / slowest.get(b.address, 1.0) for b in self.backends)


def sweep_fleets() -> dict[str, SweepFleet]:
    """The sweep's fleets, by name."""
    n = SWEEP_BACKENDS
    slow = [BackendSpec(_address(i), slots=4, mean=0.050 if i % 10 == 4 else 0.010) for i in range(n)]

    def hetero() -> list[BackendSpec]:
        return [BackendSpec(_address(i), slots=(2, 4, 8)[i % 3], mean=0.010) for i in range(n)]

    def equal() -> list[BackendSpec]:
        return [BackendSpec(_address(i), slots=4, mean=0.010) for i in range(n)]

    few = [BackendSpec(_address(i), slots=(8, 16, 32, 16, 8)[i], mean=0.010) for i in range(5)]
    noisy = tuple(_address(i) for i in range(2, n, 10))  # 5 of 50
    return {
        "slow_tenth": SweepFleet(f"{n} backends x 4 slots x 10 ms, 5 of them 5x slower (50 ms)", slow),
        "hetero_cap": SweepFleet(f"{n} backends, 2/4/8 slots (17/17/16) x 10 ms, no weights registered", hetero()),
        "noisy_neighbour": SweepFleet(
            f"{n} backends x 4 slots x 10 ms; 5 of them at half capacity (20 ms) from 30 % to 70 % of the run "
            "(u is of the capacity meanwhile)", equal(),
            changes=((NOISY[0], noisy, 2.0), (NOISY[1], noisy, 0.5))),
        "bursty": SweepFleet(f"hetero_cap's backends; arrivals on/off: {BURSTS[1]:g}x the mean rate for "
                             f"{BURSTS[0] * 500:g} ms, {BURSTS[2]:g}x for as long", hetero(), bursts=BURSTS),
        "bimodal": SweepFleet(f"{n} backends x 4 slots x 10 ms mean: {BIMODAL[0]:.0%} of calls {BIMODAL[1]:g}x "
                              "slower than the rest", equal(), bimodal=BIMODAL),
        "few_clients": SweepFleet(f"hetero_cap's backends, {FEW_CLIENTS} clients", hetero(), clients=FEW_CLIENTS),
        "many_clients": SweepFleet(f"5 backends with 8/16/32/16/8 slots x 10 ms, {MANY_CLIENTS} clients", few,
                                   clients=MANY_CLIENTS),
        "no_reports": SweepFleet("hetero_cap, servers without load reports (probes answer UNIMPLEMENTED)",
                                 hetero(), reports=False),
    }


def sweep_scenario(fleet: str, util: int, warmup: float) -> Scenario:
    f = sweep_fleets()[fleet]
    return Scenario(f"{fleet}@{util}", f.description, f.backends, rate=f.capacity() * util / 100.0, bad=None,
                    oracle_weights=capacity_weights(f.backends),
                    clients=f.clients, warmup=warmup, stagger=min(SWEEP_STAGGER, warmup), changes=f.changes,
                    bursts=f.bursts, bimodal=f.bimodal, reports=f.reports)


def capacity_weights(specs: list[BackendSpec]) -> dict[str, int]:
    """Integer weights proportional to the backends' true capacities (calls/s), divided by their greatest common
    divisor: smooth WRR's sequence depends only on the ratios, and a short cycle lets each client of the oracle
    start at a random point of it (``Simulation``)."""
    raw = {b.address: max(1, round(b.capacity)) for b in specs}
    g = math.gcd(*raw.values())
    return {a: w // g for a, w in raw.items()}


class _Call:
    __slots__ = ("arrival", "backend", "done", "finished", "started", "token", "wants_trailers")

    def __init__(self, arrival: float, backend: str, done: Any, token: tuple[int, float],
                 wants_trailers: bool = False) -> None:
        self.wants_trailers = wants_trailers
        self.arrival = arrival
        self.backend = backend
        self.done = done
        self.token = token  # the server's LoadAccount token
        self.finished = False
        self.started = False


@dataclass
class _Server:
    spec: BackendSpec
    mean: float
    account: LoadAccount
    busy: int = 0
    queue: deque = field(default_factory=deque)
    started: int = 0  # calls started (for a cold backend's first calls)


class _SimProber:
    """A client's ``LoadProber``: schedules the probe's read of the server and the answer's arrival."""

    def __init__(self, sim: Simulation, client: int) -> None:
        self._sim = sim
        self._client = client

    def probe(self, address: str) -> bool:
        sim = self._sim
        sim.probes += 1
        if sim.scenario.reports:
            sim._push(sim.now + PROBE_DELAY, "probe_read", (self._client, address))
        else:  # the server has no load-report service: UNIMPLEMENTED comes back after a round trip
            sim._push(sim.now + 2 * PROBE_DELAY, "probe_failed", (self._client, address))
        return True


class Simulation:
    """One run of one policy over one scenario."""

    def __init__(self, scenario: Scenario, policy_name: str, duration: float, seed: int,
                 config: dict[str, Any] | None = None) -> None:
        self.scenario = scenario
        self.duration = duration
        self.warmup = scenario.warmup if scenario.join is None else max(scenario.warmup, scenario.join[0] * duration)
        self.now = 0.0
        self.rng = random.Random(seed)  # arrivals and service times
        self.fail_rng = random.Random(seed + 1)
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        clock = self._clock
        self.servers = {b.address: _Server(b, b.mean, LoadAccount(clock=clock)) for b in scenario.backends}
        self.latencies: list[float] = []
        self.errors = 0
        self.probes = 0
        self.picks: Counter = Counter()
        self.busy_time: Counter = Counter()  # address -> slot-seconds busy in the measured window
        self.first_second: Counter = Counter()  # with a join: picks in the first second after it
        self.all_picks = 0
        specs = scenario.backends
        if policy_name == "oracle":
            if scenario.oracle_weights is not None:
                name = "smooth_weighted_round_robin"
                backends = [Backend(b.address, {"weight": scenario.oracle_weights[b.address]}) for b in specs]
            else:
                name = "round_robin"
                backends = [Backend(b.address) for b in specs if b.address != scenario.bad]
        else:
            name = DEFAULT_POLICY if policy_name == "default" else policy_name
            backends = [Backend(b.address, {} if b.weight is None else {"weight": b.weight}) for b in specs]
        self._all_backends = backends
        self._joins = policy_name != "oracle"  # the oracle never sees the joining (cold) backend
        if scenario.join is not None and policy_name != "oracle":
            backends = [b for b in backends if b.address != scenario.join[1]]
        cls = get_policy(name)
        parsed = cls.parse_config(config or {}, name)
        self.policies: list[Policy] = []
        self.pickers = []
        for k in range(scenario.clients):
            policy = cls(parsed, clock=clock, rng=random.Random(seed + 2 + k))
            if policy.wants_load_reports:
                policy.attach_prober(_SimProber(self, k))
            self.policies.append(policy)
            self.pickers.append(policy.build(backends))
        self._seed = seed
        self._oracle_weighted = policy_name == "oracle" and scenario.oracle_weights is not None
        if self._oracle_weighted:
            self._build_oracle()

    def _build_oracle(self) -> None:
        """The oracle's pickers: smooth weighted round robin, weights = the backends' capacities now. Clients that
        started together stay in lockstep through a deterministic rotation (the k-th pick of every client goes to
        the same backend at about the same time). Real clients started at different times: each oracle client
        starts at a random point of its weight cycle."""
        weights = capacity_weights([BackendSpec(a, s.spec.slots, s.mean) for a, s in self.servers.items()])
        backends = [Backend(a, {"weight": w}) for a, w in weights.items()]
        cycle = sum(weights.values())
        self.pickers = []
        for k, policy in enumerate(self.policies):
            picker = policy.build(backends)
            if len(self.policies) > 1:
                for _ in range(random.Random(f"{self._seed}/oracle/{k}/{cycle}").randrange(cycle)):
                    picker.pick(PickInfo()).done(Outcome())
            self.pickers.append(picker)

    def _clock(self) -> float:
        return self.now

    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _service_time(self, server: _Server) -> tuple[float, bool]:
        spec = server.spec
        if spec.fail_prob and self.fail_rng.random() < spec.fail_prob:
            return spec.fail_latency, True
        server.started += 1
        mean = server.mean * (spec.cold_factor if server.started <= spec.cold_calls else 1.0)
        bimodal = self.scenario.bimodal
        if bimodal is not None:  # the same mean, split between fast calls and a share k times slower
            share, k = bimodal
            mean = mean / (1.0 + share * (k - 1.0)) * (k if self.rng.random() < share else 1.0)
        mu = math.log(mean) - SIGMA * SIGMA / 2
        return self.rng.lognormvariate(mu, SIGMA), False

    def _start(self, server: _Server, call: _Call) -> None:
        server.busy += 1
        call.started = True
        service, failed = self._service_time(server)
        # slot-seconds busy within the measured window (a call whose client gave up still holds its slot)
        busy = min(self.now + service, self.duration) - max(self.now, self.warmup)
        if busy > 0:
            self.busy_time[server.spec.address] += busy
        self._push(self.now + service, "finish", (server, call, failed))

    def _complete(self, call: _Call, code: grpc.StatusCode, server: _Server | None = None) -> None:
        """The client sees ``call`` end; ``server``: it ended there (not at its deadline), so the trailer carries
        the server's load (``call_load``) when the pick asked for it and the servers send it."""
        call.finished = True
        latency = self.now - call.arrival
        if call.arrival >= self.warmup:
            self.latencies.append(latency)
            if code != grpc.StatusCode.OK:
                self.errors += 1
        trailers = None
        if call.wants_trailers and server is not None and self.scenario.reports:
            snap = server.account.snapshot()
            trailers = ((call_load.KEY, call_load.encode(snap.in_flight, snap.latency_estimate)),)
        call.done(Outcome(code, latency, trailers))

    def run(self) -> dict[str, Any]:
        sc = self.scenario
        rate = sc.rate / sc.clients
        bursts = sc.bursts
        if bursts is not None:  # a Poisson process at the peak rate, thinned to the rate of the moment
            _, on, off = bursts
            peak = max(on, off) / ((on + off) / 2)
            rate *= peak
        for k in range(sc.clients):
            start = self.rng.uniform(0.0, sc.stagger) if sc.stagger else 0.0
            self._push(start + self.rng.expovariate(rate), "arrival", k)
        if sc.slowdown is not None:
            frac, addr, factor = sc.slowdown
            self._push(frac * self.duration, "slowdown", (addr, factor))
        for frac, addrs, factor in sc.changes:
            self._push(frac * self.duration, "capacity", (addrs, factor))
        if sc.join is not None and self._joins:
            self._push(sc.join[0] * self.duration, "join", None)
        info = PickInfo(method="/sim.Service/Call")
        warmup = self.warmup
        events = self._events
        # Every call's deadline is its arrival + DEADLINE: the calls in arrival order are the deadlines in order, so
        # they wait in a FIFO merged with the event heap (same order as one heap, one heap operation less per call).
        deadlines: deque[_Call] = deque()
        while events or deadlines:
            if deadlines and (not events or deadlines[0].arrival + DEADLINE < events[0][0]):
                call = deadlines.popleft()
                if not call.finished:
                    self.now = call.arrival + DEADLINE
                    self._complete(call, grpc.StatusCode.DEADLINE_EXCEEDED)
                continue
            t, _, kind, payload = heapq.heappop(events)
            self.now = t
            if kind == "arrival":
                if t < self.duration:
                    self._push(t + self.rng.expovariate(rate), "arrival", payload)
                if bursts is not None:
                    level = bursts[1] if (t % bursts[0]) < bursts[0] / 2 else bursts[2]
                    if self.rng.random() * peak * (bursts[1] + bursts[2]) / 2 >= level:
                        continue  # thinned out: no call now
                res = self.pickers[payload].pick(info)
                addr = res.backend.address
                self.all_picks += 1
                if t >= warmup:
                    self.picks[addr] += 1
                    if sc.join is not None and t < warmup + 1.0:
                        self.first_second[addr] += 1
                server = self.servers[addr]
                call = _Call(t, addr, res.done, server.account.begin(), res.wants_trailers)
                if server.busy < server.spec.slots:
                    self._start(server, call)
                else:
                    server.queue.append(call)
                deadlines.append(call)
            elif kind == "finish":
                server, call, failed = payload
                server.busy -= 1
                server.account.end(call.token, failed)
                if not call.finished:
                    self._complete(call, grpc.StatusCode.UNAVAILABLE if failed else grpc.StatusCode.OK, server)
                while server.queue and server.busy < server.spec.slots:
                    nxt = server.queue.popleft()
                    if nxt.finished:  # calls whose deadline passed were cancelled: the server notices now
                        server.account.end(nxt.token, True)
                    else:
                        self._start(server, nxt)
            elif kind == "probe_read":
                client, addr = payload
                snap = self.servers[addr].account.snapshot()
                self._push(t + PROBE_DELAY, "probe_answer", (client, addr, snap.in_flight, snap.latency_estimate))
            elif kind == "probe_failed":
                client, addr = payload
                self.policies[client].on_probe_failed(addr, True)
            elif kind == "capacity":
                addrs, factor = payload
                for addr in addrs:
                    self.servers[addr].mean *= factor
                if self._oracle_weighted:  # the oracle knows the truth: weights = capacities now
                    self._build_oracle()
            elif kind == "probe_answer":
                client, addr, in_flight, latency = payload
                self.policies[client].on_probe(addr, in_flight, latency)
            elif kind == "join":
                self.pickers = [p.build(self._all_backends) for p in self.policies]
            elif kind == "slowdown":
                addr, factor = payload
                self.servers[addr].mean *= factor
        return self._summary()

    def _summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        total = len(lat)
        picked = sum(self.picks.values())
        by_kind: Counter = Counter()
        for b in self.scenario.backends:
            by_kind[b.kind] += self.picks[b.address]
        out: dict[str, Any] = {
            "calls": total,
            "p50": percentile(lat, 0.50),
            "p99": percentile(lat, 0.99),
            "p999": percentile(lat, 0.999),
            "error_rate": self.errors / total if total else 0.0,
            "share_by_kind": {k: v / picked for k, v in sorted(by_kind.items())} if picked else {},
        }
        window = self.duration - self.warmup
        if window > 0:  # each backend's busy share of its slots over the measured window
            utils = [self.busy_time[b.address] / (b.slots * window) for b in self.scenario.backends]
            out["util_max"], out["util_avg"] = max(utils), sum(utils) / len(utils)
        if len(self.scenario.backends) <= 8 and picked:
            out["share"] = {b.address: self.picks[b.address] / picked for b in self.scenario.backends}
        if self.scenario.join is not None:
            early = sum(self.first_second.values())
            out["newcomer_first_second"] = self.first_second[self.scenario.join[1]] / max(1, early)
        if any(p.wants_load_reports for p in self.policies):
            out["probes_per_call"] = self.probes / max(1, self.all_picks)
            probe_picks = sum(getattr(p, "probe_picks", 0) for p in self.policies)
            out["probe_decided"] = probe_picks / max(1, self.all_picks)  # (over the whole run, warm-up included)
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def run_policies(sc: Scenario, duration: float, seed: int, policies: list[str] = POLICIES
                 ) -> dict[str, dict[str, Any]]:
    """Every policy of ``policies`` over ``sc``. ``default`` names another policy of the list (a run is a function
    of scenario, policy, duration and seed only): its figures are that policy's; otherwise it runs on its own."""
    results: dict[str, dict[str, Any]] = {}
    for name in policies:
        if name == "default" and DEFAULT_POLICY in policies:
            continue
        results[name] = Simulation(sc, name, duration, seed).run()
    if "default" not in results:
        results["default"] = dict(results[DEFAULT_POLICY])
    return {name: results[name] for name in policies}


def label(name: str) -> str:
    return f"default={DEFAULT_POLICY}" if name == "default" else name


def run_scenarios(duration: float, seed: int, report: dict[str, Any]) -> list[str]:
    summary = []
    report["scenarios"] = {}
    for sc in scenarios():
        print(f"\n== {sc.name}: {sc.description}; {duration:g} s simulated, deadline {DEADLINE:g} s")
        print(f"{'policy':<24}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'errors':>8}  share per backend")
        results = run_policies(sc, duration, seed)
        for name, r in results.items():
            share = " ".join(f"{v:5.1%}" for v in r["share"].values())
            print(f"{label(name):<24}{r['p50'] * 1e3:9.1f}{r['p99'] * 1e3:9.1f}{r['p999'] * 1e3:9.1f}"
                  f"{r['error_rate']:8.2%}  {share}")
        ratio_rr = results["p2c_ewma"]["p99"] / results["round_robin"]["p99"]
        ratio_oracle = results["p2c_ewma"]["p99"] / results["oracle"]["p99"]
        report["scenarios"][sc.name] = {
            "description": sc.description,
            "results": results,
            "p99_p2c_over_round_robin": ratio_rr,
            "p99_p2c_over_oracle": ratio_oracle,
        }
        if sc.join is not None:
            report["scenarios"][sc.name]["slow_start"] = run_slow_start(sc, duration, seed, results)
        summary.append(f"{sc.name}: p99 p2c_ewma/round_robin = {ratio_rr:.3f}, p2c_ewma/oracle = {ratio_oracle:.3f}")
    return summary


def run_slow_start(sc: Scenario, duration: float, seed: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ramping policies again with ``slowStartWindow`` = ``SLOW_START``; prints one line per policy with the p99
    and the newcomer's share without and with it. Returns ``{"window": ..., "results": {policy: summary}}``."""
    assert sc.join is not None
    newcomer = sc.join[1]
    out: dict[str, Any] = {"window": SLOW_START, "results": {}}
    print(f"-- {sc.name}: p99, and the newcomer's share of the calls since it joined (in its first second), "
          f"without / with slowStartWindow {SLOW_START}")
    for name in SLOW_START_POLICIES:
        ramped = Simulation(sc, name, duration, seed, {"slowStartWindow": SLOW_START}).run()
        out["results"][name] = ramped
        plain = results[name]
        print(f"{sc.name} {name}: p99 {plain['p99'] * 1e3:.1f} ms, newcomer {plain['share'][newcomer]:.1%} "
              f"({plain['newcomer_first_second']:.1%}), errors {plain['error_rate']:.2%} | slowStartWindow "
              f"{SLOW_START}: p99 {ramped['p99'] * 1e3:.1f} ms, newcomer {ramped['share'][newcomer]:.1%} "
              f"({ramped['newcomer_first_second']:.1%}), errors {ramped['error_rate']:.2%}")
    return out


def run_sweep(measured: float, warmup: float, seed: int, fleets: list[str] | None = None,
              utils: tuple[int, ...] = SWEEP_UTILS) -> dict[str, Any]:
    """The utilization sweep: every policy, every fleet (or those named), every u; prints its lines, returns its
    JSON part."""
    duration = warmup + measured
    out: dict[str, Any] = {"measured": measured, "warmup": warmup, "stagger": min(SWEEP_STAGGER, warmup),
                           "clients": SWEEP_CLIENTS, "probe_delay": PROBE_DELAY, "utils": list(utils),
                           "fleets": {}}
    ratios_of: dict[str, list[tuple[float, str]]] = {}  # policy -> [(p99 / oracle, where)]
    for fleet, f in sweep_fleets().items():
        if fleets is not None and fleet not in fleets:
            continue
        description, specs, capacity = f.description, f.backends, f.capacity()
        kinds = sorted({b.kind for b in specs})
        print(f"\n== util {fleet}: {description}; capacity {capacity:.0f} calls/s, {f.clients} clients, "
              f"{warmup:g} s warm-up + {measured:g} s measured, deadline {DEADLINE:g} s")
        points: dict[str, Any] = {}
        for util in utils:
            sc = sweep_scenario(fleet, util, warmup)
            results = run_policies(sc, duration, seed, SWEEP_POLICIES)
            oracle = results["oracle"]["p99"]
            ratios = {name: r["p99"] / oracle for name, r in results.items() if name != "oracle"}
            print(f"\n-- util {fleet} u={util}%: {sc.rate:.0f} calls/s offered, {results['oracle']['calls']} calls "
                  f"measured (oracle)")
            print(f"{'policy':<24}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'errors':>8}{'util max/avg':>14}  "
                  f"share {' '.join(kinds)}")
            for name, r in results.items():
                share = " ".join(f"{r['share_by_kind'].get(k, 0.0):5.1%}" for k in kinds)
                probes = (f"  probes/call {r['probes_per_call']:.3f}, picks by probes {r['probe_decided']:.0%}"
                          if "probe_decided" in r else "")
                print(f"{label(name):<24}{r['p50'] * 1e3:9.1f}{r['p99'] * 1e3:9.1f}{r['p999'] * 1e3:9.1f}"
                      f"{r['error_rate']:8.2%}{_util(r):>14}  {share}{probes}")
            for name, ratio in ratios.items():
                print(f"util {fleet} u={util}%: p99 {name}/oracle = {ratio:.3f}, backend utilization max/avg = "
                      f"{_util(results[name])}")
                ratios_of.setdefault(name, []).append((ratio, f"{fleet} u={util}%"))
            points[str(util)] = {"rate": sc.rate, "results": results, "p99_over_oracle": ratios}
        out["fleets"][fleet] = {"description": description, "capacity": capacity, "points": points}

    print(f"\nutil: p99 / oracle p99 ({warmup:g} s warm-up + {measured:g} s measured); the oracle's and the "
          "default's backend utilization max/avg")
    names = [n for n in SWEEP_POLICIES if n != "oracle"]
    print(f"{'fleet':<16}{'u':>4}  {'oracle ms':>9}" + "".join(f"{n[:12]:>13}" for n in names)
          + f"{'oracle util':>13}{'default util':>14}")
    for fleet, fd in out["fleets"].items():
        for util, pt in fd["points"].items():
            print(f"{fleet:<16}{util + '%':>4}  {pt['results']['oracle']['p99'] * 1e3:9.1f}"
                  + "".join(f"{pt['p99_over_oracle'][n]:13.2f}" for n in names)
                  + f"{_util(pt['results']['oracle']):>13}{_util(pt['results']['default']):>14}")
    # ranked by the worst ratio; policies pinned at the deadline tie there, the geometric mean orders them
    rows = []
    for name, values in ratios_of.items():
        w, at = max(values)
        gmean = math.exp(sum(math.log(v) for v, _ in values) / len(values))
        rows.append({"policy": name, "worst_p99_over_oracle": w, "at": at, "geomean_p99_over_oracle": gmean})
    default = next(r for r in rows if r["policy"] == "default")
    ranking = sorted((r for r in rows if r["policy"] != "default"),
                     key=lambda r: (r["worst_p99_over_oracle"], r["geomean_p99_over_oracle"], r["policy"]))
    out["ranking"] = ranking
    out["default"] = {**default, "policy": DEFAULT_POLICY}
    print(f"\nutil: policies ranked by their worst p99/oracle over every fleet and u = "
          f"{', '.join(map(str, utils))} % (ties: by the geometric mean)")
    for line in ranking_lines(out):
        print(line)
    return out


def _util(r: dict[str, Any]) -> str:
    """A run's backend utilization, max/avg, in percent."""
    return f"{r['util_max']:.0%}/{r['util_avg']:.0%}"


def ranking_lines(sweep: dict[str, Any]) -> list[str]:
    lines = [f"util rank {n}: {r['policy']} worst p99/oracle = {r['worst_p99_over_oracle']:.3f} ({r['at']}), "
             f"geomean {r['geomean_p99_over_oracle']:.3f}" for n, r in enumerate(sweep["ranking"], 1)]
    d = sweep["default"]
    lines.append(f"util default = {d['policy']}: worst p99/oracle = {d['worst_p99_over_oracle']:.3f} ({d['at']}), "
                 f"geomean {d['geomean_p99_over_oracle']:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs (CI and tests)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=None, help="simulated seconds per scenario run")
    ap.add_argument("--sweep-duration", type=float, default=None,
                    help=f"simulated seconds measured per sweep run, after a warm-up of {SWEEP_WARMUP[0]:g} s "
                         f"({SWEEP_WARMUP[1]:g} s with --quick)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--no-sweep", action="store_true", help="only the scenarios")
    group.add_argument("--sweep-only", action="store_true", help="only the utilization sweep")
    ap.add_argument("--fleets", default=None,
                    help=f"comma-separated sweep fleets (default: all of {', '.join(sweep_fleets())})")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "simulate.json")
    args = ap.parse_args(argv)
    duration = args.duration or (4.0 if args.quick else 20.0)
    sweep_measured = args.sweep_duration or (0.25 if args.quick else 1.5)
    sweep_warmup = SWEEP_WARMUP[1] if args.quick else SWEEP_WARMUP[0]

    started = time.perf_counter()
    report: dict[str, Any] = {"duration": duration, "seed": args.seed, "deadline": DEADLINE,
                              "default_policy": DEFAULT_POLICY}
    summary: list[str] = []
    if not args.sweep_only:
        summary = run_scenarios(duration, args.seed, report)
    if not args.no_sweep:
        fleets = None if args.fleets is None else args.fleets.split(",")
        unknown = sorted(set(fleets or ()) - set(sweep_fleets()))
        if unknown:
            ap.error(f"--fleets: unknown fleet(s) {unknown}; choose from {list(sweep_fleets())}")
        report["sweep"] = run_sweep(sweep_measured, sweep_warmup, args.seed, fleets,
                                    QUICK_UTILS if args.quick else SWEEP_UTILS)
    report["wall_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out} in {report['wall_seconds']:.1f} s wall")
    if args.sweep_only:  # the last lines stay the summary: here, the sweep's ranking
        for line in ranking_lines(report["sweep"]):
            print(line)
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
