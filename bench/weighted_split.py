#!/usr/bin/env python3
"""How registered weights split the calls under the load-aware policies, from idle to 16 calls in flight.

A deterministic discrete-event simulation driving the real pickers (``Policy.build`` / ``Picker.pick`` /
``done(Outcome)``, the simulation clock injected as the policy clock, a seeded rng): ``--in-flight`` closed-loop
callers (each sends its next call the moment its last one ends: 1 is sequential calls, nothing else in flight)
against backends that are equal in everything but their registered weight: every call takes ``LATENCY`` seconds
times a seeded jitter of +-20 %, whatever the load. Each simulated server keeps a real
``waypost.orca.LoadAccount`` on the simulation clock (a call counts there from its pick to its end), and
``prequal`` gets a simulated prober that reads it ``PROBE_DELAY`` after a probe is sent and answers as long again
later, so its probe choice is measured, not only its peak_ewma fallback.

What a weight should give when the fleet is idle is its share (``weight / total``): Envoy's weighted least request
and gRPC's weighted round robin give that. Each cell is the share of the calls each backend got over
``--calls`` calls after ``--warmup`` unmeasured ones, and ``off`` the largest gap to the weight share, in points.

Usage: python bench/weighted_split.py [--calls N] [--warmup N] [--seed N] [--out PATH]
Prints one table row per policy, weights and in-flight count; writes JSON (default
bench/results/weighted_split.json).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import grpc

from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.orca.account import LoadAccount
from waypost.types import Backend

POLICIES = ("peak_ewma", "p2c_ewma", "least_request", "prequal")
WEIGHTS = {"100:10": (100, 10), "10:20:30": (10, 20, 30)}
IN_FLIGHT = (1, 4, 16)
LATENCY = 0.010  # seconds: every backend's service time, jittered +-20 %
JITTER = 0.2
#: seconds, one way, for load-report probes only (as bench/simulate.py: a same-zone round trip of 0.5 ms)
PROBE_DELAY = 0.00025


class _Prober:
    """``prequal``'s ``LoadProber``: the answer is the server's LoadAccount snapshot, read after one delay."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def probe(self, address: str) -> bool:
        self._sim.push(self._sim.now + PROBE_DELAY, "probe_read", address)
        return True

    def open_stream(self, address: str, method: str, request: bytes, on_message: Any) -> bool:
        return False  # no policy measured here keeps a stream

    def close_stream(self, address: str, method: str) -> None:
        return None


class Simulation:
    """One policy over one weighted fleet at one in-flight count."""

    def __init__(self, policy: str, weights: tuple[int, ...], in_flight: int, seed: int) -> None:
        self.now = 0.0
        self.in_flight = in_flight
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._jitter = random.Random(seed + 1)
        addresses = [f"10.0.0.{i + 1}:50051" for i in range(len(weights))]
        self.weights = dict(zip(addresses, weights))
        self.accounts = {a: LoadAccount(clock=self.clock) for a in addresses}
        self.policy = get_policy(policy)(None, clock=self.clock, rng=random.Random(seed))
        if self.policy.wants_load_reports:
            self.policy.attach_prober(_Prober(self))
        self.picker = self.policy.build([Backend(a, {"weight": w}) for a, w in self.weights.items()])

    def clock(self) -> float:
        return self.now

    def push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _start(self) -> str:
        res = self.picker.pick(PickInfo())
        address = res.backend.address
        token = self.accounts[address].begin()
        latency = LATENCY * self._jitter.uniform(1 - JITTER, 1 + JITTER)
        self.push(self.now + latency, "end", (address, token, res.done, latency))
        return address

    def run(self, warmup: int, calls: int) -> Counter[str]:
        """The calls each backend got among the ``calls`` started after ``warmup`` ones."""
        served: Counter[str] = Counter()
        started = 0
        for _ in range(self.in_flight):
            self._start()
            started += 1
        while started < warmup + calls:
            self.now, _, kind, payload = heapq.heappop(self._events)
            if kind == "end":
                address, token, done, latency = payload
                self.accounts[address].end(token)
                done(Outcome(grpc.StatusCode.OK, latency))
                picked = self._start()
                started += 1
                if started > warmup:
                    served[picked] += 1
            elif kind == "probe_read":
                snap = self.accounts[payload].snapshot()
                self.push(self.now + PROBE_DELAY, "probe_answer", (payload, snap.in_flight, snap.latency_estimate))
            else:
                self.policy.on_probe(*payload)
        return served


def cell(policy: str, weights: tuple[int, ...], in_flight: int, warmup: int, calls: int, seed: int) -> dict[str, Any]:
    sim = Simulation(policy, weights, in_flight, seed)
    served = sim.run(warmup, calls)
    total = sum(served.values())
    shares = [served[a] / total for a in sim.weights]
    expected = [w / sum(weights) for w in weights]
    out: dict[str, Any] = {"policy": policy, "weights": list(weights), "in_flight": in_flight,
                           "shares": [round(s, 4) for s in shares],
                           "off_points": round(max(abs(s - e) for s, e in zip(shares, expected)) * 100, 2)}
    if policy == "prequal":
        out["probe_decided"] = round(getattr(sim.policy, "probe_picks", 0) / (warmup + calls), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="measured calls per cell")
    ap.add_argument("--warmup", type=int, default=2000, help="unmeasured calls before them")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench/results/weighted_split.json"))
    args = ap.parse_args(argv)
    if args.calls < 1 or args.warmup < 0:
        ap.error("--calls must be at least 1 and --warmup at least 0")
    t0 = time.monotonic()
    rows = []
    print(f"{'policy':<14} {'weights':<9} {'in flight':>9}  {'shares (%)':<22} {'off (points)':>12}")
    for policy in POLICIES:
        for label, weights in WEIGHTS.items():
            for n in IN_FLIGHT:
                row = cell(policy, weights, n, args.warmup, args.calls, args.seed)
                rows.append(row)
                shares = "/".join(f"{s * 100:.1f}" for s in row["shares"])
                extra = f"  (picks by probes {row['probe_decided']:.0%})" if "probe_decided" in row else ""
                print(f"{policy:<14} {label:<9} {n:>9}  {shares:<22} {row['off_points']:>12.1f}{extra}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "latency": LATENCY, "jitter": JITTER,
                               "expected": {k: [round(w / sum(v), 4) for w in v] for k, v in WEIGHTS.items()},
                               "rows": rows, "elapsed_s": round(time.monotonic() - t0, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
