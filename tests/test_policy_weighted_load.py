"""Registered weights under the load-aware policies (peak_ewma, the default; p2c_ewma; least_request; prequal).

A weight is a capacity statement: loads are divided by it before two are compared (Envoy's weighted least
request), so at equal latency and with calls in flight traffic follows the weights; weight 0 drains. Driven with
the policy clock and random source injected: a closed loop of ``CONCURRENCY`` callers against backends that all
answer in the same time, so the shares are exact for a seed, not timings.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import Any

import grpc
import pytest

from tests.policy_support import FakeClock
from waypost.balancer.base import Outcome, PickError, PickInfo
from waypost.balancer.policies import get_policy
from waypost.types import Backend

LOAD_AWARE = ["peak_ewma", "p2c_ewma", "least_request", "prequal"]
CONCURRENCY = 16
LATENCY = 0.010


def _policy(name: str, seed: int = 7) -> tuple[Any, FakeClock]:
    clock = FakeClock(100.0)
    return get_policy(name)(None, clock=clock, rng=random.Random(seed)), clock


def _backends(weights: dict[str, Any]) -> list[Backend]:
    return [Backend(a, {} if w is None else {"weight": w}) for a, w in weights.items()]


def _closed_loop(name: str, weights: dict[str, Any], calls: int = 6000, seed: int = 7) -> Counter[str]:
    """``CONCURRENCY`` callers, each starting its next call when the last ends; every backend answers in
    ``LATENCY`` s (times a seeded +-20 % jitter). Returns the calls each backend got."""
    policy, clock = _policy(name, seed)
    picker = policy.build(_backends(weights))
    jitter = random.Random(seed + 1)
    served: Counter[str] = Counter()
    ends: list[tuple[float, int, Any]] = []
    n = 0

    def start() -> None:
        nonlocal n
        res = picker.pick(PickInfo())
        served[res.backend.address] += 1
        n += 1
        heapq.heappush(ends, (clock.now + LATENCY * jitter.uniform(0.8, 1.2), n, res.done))

    for _ in range(CONCURRENCY):
        start()
    for _ in range(calls):
        t, _, done = heapq.heappop(ends)
        elapsed = t - clock.now
        clock.now = t
        done(Outcome(grpc.StatusCode.OK, max(elapsed, LATENCY)))
        start()
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


def test_a_slow_heavy_backend_still_loses_to_a_fast_light_one():
    """Weights scale the load, they do not override it: a heavy backend 10x slower than its peer gets less."""
    policy, clock = _policy("peak_ewma")
    picker = policy.build(_backends({"heavy:1": 40, "light:1": 10}))
    served: Counter[str] = Counter()
    for _ in range(2000):
        res = picker.pick(PickInfo())
        served[res.backend.address] += 1
        latency = 0.100 if res.backend.address == "heavy:1" else 0.010
        clock.now += 0.001
        res.done(Outcome(grpc.StatusCode.OK, latency))
    assert served["light:1"] > served["heavy:1"], served
