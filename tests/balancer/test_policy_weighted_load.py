"""Registered weights under the load-aware policies (prequal, the default; peak_ewma; p2c_ewma; least_request).

Weighted P2C (``weights.Capacity``): candidates drawn by weight with replacement, compared on their calls in
flight per unit of capacity; so the weight is a share when the fleet is idle, traffic follows the weights at equal
latency under load, and weight 0 drains. Driven with the policy clock and random source injected: a closed loop of
callers against backends that all answer in the same time (times a seeded jitter), each with a real
``LoadAccount`` that a simulated prober reads for ``prequal``, so the shares are exact for a seed, not timings.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import Any

import grpc
import pytest

from tests.balancer.support import FakeClock
from waypost.balancer.base import Outcome, PickError, PickInfo
from waypost.balancer.policies import get_policy
from waypost.orca.account import LoadAccount
from waypost.types import Backend

LOAD_AWARE = ["peak_ewma", "p2c_ewma", "least_request", "prequal"]
CONCURRENCY = 16
LATENCY = 0.010
PROBE_DELAY = 0.00025  # seconds each way between prequal's prober and a backend's load account


def _policy(name: str, seed: int = 7) -> tuple[Any, FakeClock]:
    clock = FakeClock(100.0)
    return get_policy(name)(None, clock=clock, rng=random.Random(seed)), clock


def _backends(weights: dict[str, Any]) -> list[Backend]:
    return [Backend(a, {} if w is None else {"weight": w}) for a, w in weights.items()]


class _Prober:
    """prequal's prober in the simulation: a probe reads the backend's LoadAccount ``PROBE_DELAY`` after it is sent
    and the answer reaches the policy as long again later (events on the loop's heap)."""

    def __init__(self, push: Any) -> None:
        self._push = push

    def probe(self, address: str) -> bool:
        self._push(PROBE_DELAY, ("probe", address))
        return True

    def open_stream(self, address: str, method: str, request: bytes, on_message: Any) -> bool:
        return False

    def close_stream(self, address: str, method: str) -> None:
        return None


def _closed_loop(name: str, weights: dict[str, Any], calls: int = 6000, seed: int = 7,
                 concurrency: int = CONCURRENCY) -> Counter[str]:
    """``concurrency`` callers, each starting its next call when the last ends (1: sequential calls); every backend
    answers in ``LATENCY`` s (times a seeded +-20 % jitter). Returns the calls each backend got."""
    policy, clock = _policy(name, seed)
    accounts = {a: LoadAccount(clock=clock) for a in weights}
    events: list[tuple[float, int, Any]] = []
    seq = 0

    def push(delay: float, event: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (clock.now + delay, seq, event))

    if policy.wants_load_reports:
        policy.attach_prober(_Prober(push))
    picker = policy.build(_backends(weights))
    jitter = random.Random(seed + 1)
    served: Counter[str] = Counter()

    def start() -> None:
        res = picker.pick(PickInfo())
        address = res.backend.address
        served[address] += 1
        push(LATENCY * jitter.uniform(0.8, 1.2), ("end", address, accounts[address].begin(), clock.now, res.done))

    for _ in range(concurrency):
        start()
    ended = 0
    while ended < calls:
        clock.now, _, event = heapq.heappop(events)
        if event[0] == "end":
            _, address, token, began, done = event
            accounts[address].end(token)
            done(Outcome(grpc.StatusCode.OK, clock.now - began))
            ended += 1
            start()
        elif event[0] == "probe":
            snap = accounts[event[1]].snapshot()
            push(PROBE_DELAY, ("answer", event[1], snap.in_flight, snap.latency_estimate))
        else:
            policy.on_probe(*event[1:])
    return served


def _shares(served: Counter[str]) -> dict[str, float]:
    total = sum(served.values())
    return {a: served[a] / total for a in sorted(served)}


@pytest.mark.parametrize("name", LOAD_AWARE)
def test_at_equal_latency_traffic_follows_the_registered_weights(name):
    weights = {"a:1": 10, "b:1": 20, "c:1": 30}
    shares = _shares(_closed_loop(name, weights))
    expected = {a: w / 60 for a, w in weights.items()}
    print(name, {a: round(s, 3) for a, s in shares.items()})
    assert shares["a:1"] < shares["b:1"] < shares["c:1"]
    for a in weights:
        assert shares[a] == pytest.approx(expected[a], abs=0.06), (a, shares)


@pytest.mark.parametrize("name", LOAD_AWARE)
def test_two_keys_over_the_same_servers_each_follow_their_own_weights(name):
    """Two services served by the same two processes, registered 100:10 under one key and 10:100 under the
    other: each key's traffic goes mostly to its heavy server (least_request draws its pair with replacement, as
    gRPC's does, so each of two backends is drawn twice in a quarter of the picks: at least 25 % each)."""
    one = _shares(_closed_loop(name, {"x:1": 100, "y:1": 10}))
    other = _shares(_closed_loop(name, {"x:1": 10, "y:1": 100}))
    print(name, round(one["x:1"], 3), round(other["y:1"], 3))
    floor = 0.7 if name == "least_request" else 0.85
    assert one["x:1"] > floor and other["y:1"] > floor, (one, other)


@pytest.mark.parametrize("name", LOAD_AWARE)
def test_equal_weights_pick_exactly_as_no_weights(name):
    """An unweighted fleet (or one registered with equal weights) is balanced as it always was: the same picks
    for the same seed."""
    unweighted = _closed_loop(name, {"a:1": None, "b:1": None, "c:1": None}, calls=2000)
    equal = _closed_loop(name, {"a:1": 5, "b:1": 5, "c:1": "5"}, calls=2000)
    assert unweighted == equal


@pytest.mark.parametrize("name", LOAD_AWARE)
def test_weight_zero_drains_and_all_drained_says_so(name):
    served = _closed_loop(name, {"a:1": 0, "b:1": None, "c:1": 50}, calls=1000)
    assert served["a:1"] == 0 and served["b:1"] > 0 and served["c:1"] > 0
    policy, _ = _policy(name)
    picker = policy.build(_backends({"a:1": 0, "b:1": 0}))
    with pytest.raises(PickError) as e:
        picker.pick(PickInfo())
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "every backend has weight 0" in str(e.value) and name in str(e.value)


@pytest.mark.parametrize("name", LOAD_AWARE)
@pytest.mark.parametrize("weights", [{"x:1": 100, "y:1": 10}, {"a:1": 10, "b:1": 20, "c:1": 30}],
                         ids=["100:10", "10:20:30"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_at_light_load_the_weight_is_the_share(name, weights, concurrency):
    """Sequential calls (nothing else in flight) and 4 at a time: each backend gets its weight's share of the
    calls, within 5 points (bench/weighted_split.py measures within 2.5 points for every policy).
    Dividing the whole load by the weight, as before, sent 99.9 % of sequential calls to the heavy one of 100:10."""
    shares = _shares(_closed_loop(name, weights, calls=4000, concurrency=concurrency))
    total = sum(weights.values())
    print(name, concurrency, {a: round(s, 3) for a, s in shares.items()})
    for a, w in weights.items():
        assert shares.get(a, 0.0) == pytest.approx(w / total, abs=0.05), (a, shares)


@pytest.mark.parametrize("name", ["peak_ewma", "p2c_ewma"])
def test_a_slow_heavy_backend_keeps_only_its_double_draws(name):
    """Weights do not override latency: a heavy backend 10x slower than its peer loses every comparison it is
    drawn into and keeps only the picks where it is drawn twice (share 0.8 drawn twice: 64 %), not its 80 %."""
    policy, clock = _policy(name)
    picker = policy.build(_backends({"heavy:1": 40, "light:1": 10}))
    served: Counter[str] = Counter()
    for _ in range(4000):
        res = picker.pick(PickInfo())
        served[res.backend.address] += 1
        latency = 0.100 if res.backend.address == "heavy:1" else 0.010
        clock.now += 0.001
        res.done(Outcome(grpc.StatusCode.OK, latency))
    heavy = served["heavy:1"] / 4000
    assert heavy == pytest.approx(0.8 * 0.8, abs=0.03), served


@pytest.mark.parametrize("name", ["peak_ewma", "prequal"])
def test_a_failing_heavy_backend_is_compared_even_when_drawn_twice(name):
    """A backend whose calls fail (fast) has no floor: drawn twice, it is compared with one of the others, and
    loses (a failure counts as ``FAILURE_RTT``). Without that, the heavy one of 100:10 would keep the 83 % of
    picks where it is drawn twice. (p2c_ewma, as go-zero, compares latency only: a backend failing in 1 ms looks
    fast there, weighted or not.)"""
    policy, clock = _policy(name)
    picker = policy.build(_backends({"bad:1": 100, "good:1": 10}))
    served: Counter[str] = Counter()
    for k in range(3000):
        res = picker.pick(PickInfo())
        bad = res.backend.address == "bad:1"
        if k >= 1000:  # after the first failures are known
            served[res.backend.address] += 1
        clock.now += 0.005
        res.done(Outcome(grpc.StatusCode.UNAVAILABLE if bad else grpc.StatusCode.OK, 0.001 if bad else 0.010))
    assert served["bad:1"] < 0.05 * 2000, served


def test_end_to_end_sequential_calls_over_real_servers_share_by_weight():
    """Two real gRPC servers registered 100:10 through a registry, calls one after another, ``least_request``:
    nothing is in flight at a pick, so every comparison ties and the first candidate drawn, by weight, is taken:
    the light server's share is its 9.1 % whatever the timings (the latency-aware policies add latency noise to
    that; bench/weighted_split.py). Before, the pair was drawn uniformly and the heavy one won the ties of
    ``(in flight + 1) / weight``: 24 % to the light one."""
    import itertools
    import os

    import waypost
    from harness.backends import echo_pb2, echo_pb2_grpc
    from harness.waiting import wait_until
    from tests.channel.support import echo_servers

    name = f"wload{os.getpid()}x{next(itertools.count())}"
    registry = waypost.connect(f"memory://{name}")
    calls = 1200
    with echo_servers("heavy", "light") as (heavy, light):
        pubs = [waypost.Publisher(registry, "w.rpc", heavy.address, metadata={"weight": 100}).start(),
                waypost.Publisher(registry, "w.rpc", light.address, metadata={"weight": 10}).start()]
        try:
            with waypost.dial(f"memory://{name}/?key=w.rpc", balancer="least_request") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(echo_pb2.EchoRequest())
                           and False, 30, what="both backends READY")
                got = Counter(stub.Unary(echo_pb2.EchoRequest(), timeout=20).server for _ in range(calls))
        finally:
            for p in pubs:
                p.stop()
    print("end to end, 100:10 sequential, least_request:", dict(got))
    assert 0.055 < got["light"] / calls < 0.13, got  # 9.1 % expected, +-4 binomial sigmas
