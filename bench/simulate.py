#!/usr/bin/env python3
"""Deterministic discrete-event simulation of client-side load balancing policies.

N backends, each with a number of concurrent slots (calls beyond that queue, FIFO), a lognormal
service time and optionally a share of calls that fail fast; Poisson arrivals; a per-call deadline
(the client gives up: DEADLINE_EXCEEDED at the deadline, the call stays queued/in service on the
backend, as a cancelled gRPC call does until the server notices). The real waypost pickers are driven
through ``Policy.build`` / ``Picker.pick`` / ``done(Outcome)`` with the simulation clock injected as
the policy clock. No threads, no sleeping; everything is seeded.

Scenarios
  slow_backend   1 of 4 backends is 10x slower throughout
  degrading      all equal, then one backend becomes 10x slower half-way through
  heterogeneous  slot counts 1:2:4:8 (registered weights = capacities, which weighted_round_robin uses)
  flapping       one backend fails 30% of its calls, failing fast

Policies: round_robin, random, weighted_round_robin, least_request, p2c_ewma and ``oracle``:
round_robin over the set without the bad backend (for heterogeneous, where no single backend is bad,
the oracle is weighted round robin by true capacity).

Usage: python bench/simulate.py [--quick] [--seed N] [--out PATH]
The last lines, one per scenario: ``<scenario>: p99 p2c_ewma/round_robin = R, p2c_ewma/oracle = R``.
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

from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.types import Backend

POLICIES = ["round_robin", "random", "weighted_round_robin", "least_request", "p2c_ewma", "oracle"]
DEADLINE = 1.0  # seconds: the client's per-call deadline
SIGMA = 0.5  # lognormal shape of service times


@dataclass
class BackendSpec:
    address: str
    slots: int
    mean: float  # mean service time, seconds
    fail_prob: float = 0.0
    fail_latency: float = 0.001
    weight: int | None = None  # registered metadata weight


@dataclass
class Scenario:
    name: str
    description: str
    backends: list[BackendSpec]
    rate: float  # arrivals per second
    bad: str | None  # removed for the oracle
    slowdown: tuple[float, str, float] | None = None  # (fraction of the run, address, factor)
    oracle_weighted: bool = False


def scenarios() -> list[Scenario]:
    def equal(n: int = 4) -> list[BackendSpec]:
        return [BackendSpec(f"10.0.0.{i + 1}:8080", slots=8, mean=0.010) for i in range(n)]

    slow = equal()
    slow[3].mean = 0.100
    flap = equal()
    flap[3].fail_prob = 0.30
    hetero = [
        BackendSpec(f"10.0.0.{i + 1}:8080", slots=2 * c, mean=0.010, weight=c) for i, c in enumerate((1, 2, 4, 8))
    ]
    return [
        Scenario("slow_backend", "1 of 4 backends 10x slower (8 slots x 10 ms each, 1200 rps)", slow, 1200.0,
                 bad=slow[3].address),
        Scenario("degrading", "one of 4 backends becomes 10x slower half-way (1200 rps)", equal(), 1200.0,
                 bad="10.0.0.4:8080", slowdown=(0.5, "10.0.0.4:8080", 10.0)),
        Scenario("heterogeneous", "slots 2:4:8:16 x 10 ms (capacities 1:2:4:8), 1800 rps = 60% of capacity",
                 hetero, 1800.0, bad=None, oracle_weighted=True),
        Scenario("flapping", "one of 4 backends fails 30% of calls in 1 ms (1200 rps)", flap, 1200.0,
                 bad=flap[3].address),
    ]


@dataclass
class _Call:
    arrival: float
    backend: str
    done: Any
    finished: bool = False
    started: bool = False


@dataclass
class _Server:
    spec: BackendSpec
    mean: float
    busy: int = 0
    queue: deque = field(default_factory=deque)


class Simulation:
    """One run of one policy over one scenario."""

    def __init__(self, scenario: Scenario, policy_name: str, duration: float, seed: int) -> None:
        self.scenario = scenario
        self.duration = duration
        self.now = 0.0
        self.rng = random.Random(seed)  # arrivals and service times
        self.fail_rng = random.Random(seed + 1)
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.servers = {b.address: _Server(b, b.mean) for b in scenario.backends}
        self.latencies: list[float] = []
        self.errors = 0
        self.picks: Counter = Counter()
        specs = scenario.backends
        if policy_name == "oracle":
            if scenario.oracle_weighted:
                name = "weighted_round_robin"
                backends = [Backend(b.address, {"weight": b.slots}) for b in specs]
            else:
                name = "round_robin"
                backends = [Backend(b.address) for b in specs if b.address != scenario.bad]
        else:
            name = policy_name
            backends = [Backend(b.address, {} if b.weight is None else {"weight": b.weight}) for b in specs]
        policy = get_policy(name)({}, clock=lambda: self.now, rng=random.Random(seed + 2))
        self.picker = policy.build(backends)

    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _service_time(self, server: _Server) -> tuple[float, bool]:
        spec = server.spec
        if spec.fail_prob and self.fail_rng.random() < spec.fail_prob:
            return spec.fail_latency, True
        mu = math.log(server.mean) - SIGMA * SIGMA / 2
        return self.rng.lognormvariate(mu, SIGMA), False

    def _start(self, server: _Server, call: _Call) -> None:
        server.busy += 1
        call.started = True
        service, failed = self._service_time(server)
        self._push(self.now + service, "finish", (server, call, failed))

    def _complete(self, call: _Call, code: grpc.StatusCode) -> None:
        call.finished = True
        latency = self.now - call.arrival
        self.latencies.append(latency)
        if code != grpc.StatusCode.OK:
            self.errors += 1
        call.done(Outcome(code, latency))

    def run(self) -> dict[str, Any]:
        self._push(self.rng.expovariate(self.scenario.rate), "arrival", None)
        if self.scenario.slowdown is not None:
            frac, addr, factor = self.scenario.slowdown
            self._push(frac * self.duration, "slowdown", (addr, factor))
        info = PickInfo(method="/sim.Service/Call")
        while self._events:
            t, _, kind, payload = heapq.heappop(self._events)
            self.now = t
            if kind == "arrival":
                if t < self.duration:
                    self._push(t + self.rng.expovariate(self.scenario.rate), "arrival", None)
                res = self.picker.pick(info)
                addr = res.backend.address
                self.picks[addr] += 1
                call = _Call(t, addr, res.done)
                server = self.servers[addr]
                if server.busy < server.spec.slots:
                    self._start(server, call)
                else:
                    server.queue.append(call)
                self._push(t + DEADLINE, "deadline", call)
            elif kind == "finish":
                server, call, failed = payload
                server.busy -= 1
                if not call.finished:
                    self._complete(call, grpc.StatusCode.UNAVAILABLE if failed else grpc.StatusCode.OK)
                while server.queue and server.busy < server.spec.slots:
                    nxt = server.queue.popleft()
                    if not nxt.finished:  # calls whose deadline passed were cancelled
                        self._start(server, nxt)
            elif kind == "deadline":
                if not payload.finished:
                    self._complete(payload, grpc.StatusCode.DEADLINE_EXCEEDED)
            elif kind == "slowdown":
                addr, factor = payload
                self.servers[addr].mean *= factor
        lat = sorted(self.latencies)
        total = len(lat)
        return {
            "calls": total,
            "p50": percentile(lat, 0.50),
            "p99": percentile(lat, 0.99),
            "p999": percentile(lat, 0.999),
            "error_rate": self.errors / total if total else 0.0,
            "share": {b.address: self.picks[b.address] / total for b in self.scenario.backends},
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs (CI and tests)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=None, help="simulated seconds per run")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "simulate.json")
    args = ap.parse_args(argv)
    duration = args.duration or (4.0 if args.quick else 20.0)

    started = time.perf_counter()
    report: dict[str, Any] = {"duration": duration, "seed": args.seed, "deadline": DEADLINE, "scenarios": {}}
    summary = []
    for sc in scenarios():
        print(f"\n== {sc.name}: {sc.description}; {duration:g} s simulated, deadline {DEADLINE:g} s")
        print(f"{'policy':<22}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'errors':>8}  share per backend")
        results = {}
        for name in POLICIES:
            r = Simulation(sc, name, duration, args.seed).run()
            results[name] = r
            share = " ".join(f"{v:5.1%}" for v in r["share"].values())
            print(f"{name:<22}{r['p50'] * 1e3:9.1f}{r['p99'] * 1e3:9.1f}{r['p999'] * 1e3:9.1f}"
                  f"{r['error_rate']:8.2%}  {share}")
        ratio_rr = results["p2c_ewma"]["p99"] / results["round_robin"]["p99"]
        ratio_oracle = results["p2c_ewma"]["p99"] / results["oracle"]["p99"]
        report["scenarios"][sc.name] = {
            "description": sc.description,
            "results": results,
            "p99_p2c_over_round_robin": ratio_rr,
            "p99_p2c_over_oracle": ratio_oracle,
        }
        summary.append(f"{sc.name}: p99 p2c_ewma/round_robin = {ratio_rr:.3f}, p2c_ewma/oracle = {ratio_oracle:.3f}")
    report["wall_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out} in {report['wall_seconds']:.1f} s wall")
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
