"""slowStartWindow: a backend that just appeared ramps up its share (peak_ewma, prequal, least_request, p2c_ewma);
fake clock, seeded rngs."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer import slow_start
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig
from waypost.service_config import parse_service_config

OK = grpc.StatusCode.OK
RAMPED = ["peak_ewma", "prequal", "least_request", "p2c_ewma"]
OLD = ["a", "b", "c"]


def make(name: str, clock: FakeClock, window: str | None, seed: int = 3):
    raw = {} if window is None else {"slowStartWindow": window}
    cls = get_policy(name)
    return cls(cls.parse_config(raw, f"lb.{name}"), clock=clock, rng=random.Random(seed))


def share_of(policy, picker, addr: str, clock: FakeClock, n: int = 400, step: float = 0.0) -> float:
    """The share of ``n`` picks that went to ``addr``; each call ends at once with 10 ms (the clock moves ``step``
    per pick)."""
    got: Counter[str] = Counter()
    for _ in range(n):
        res = picker.pick(PickInfo())
        got[res.backend.address] += 1
        clock.now += step
        res.done(Outcome(OK, 0.010))
    return got[addr] / n


def warmed(name: str, window: str | None, seed: int = 3):
    """The policy with a, b, c measured for 5 s, then d joining: (policy, picker with d, clock)."""
    clock = FakeClock(100.0)
    policy = make(name, clock, window, seed)
    picker = policy.build(bs(OLD))
    share_of(policy, picker, "a", clock, n=500, step=0.01)
    return policy, policy.build(bs(*OLD, "d")), clock


@pytest.mark.parametrize("name", RAMPED)
def test_window_parsed_zero_is_off_and_bad_values_name_the_path(name):
    cls = get_policy(name)
    assert cls.parse_config({"slowStartWindow": "10s"}, "p")["slowStartWindow"] == 10.0
    assert cls.parse_config({"slowStartWindow": "0s"}, "p")["slowStartWindow"] == 0.0
    for bad in ("10", 10, "-1s", "soon", None):
        with pytest.raises(InvalidServiceConfig, match=r"^p\.slowStartWindow: "):
            cls.parse_config({"slowStartWindow": bad}, "p")
    cfg = parse_service_config({"loadBalancingConfig": [{name: {"slowStartWindow": "2.5s"}}]})
    assert cfg.lb_config == {"slowStartWindow": 2.5}


def test_p2c_ewma_takes_only_the_window_and_is_go_zero_by_default():
    cls = get_policy("p2c_ewma")
    assert cls.parse_config({}, "p") == {} and cls.parse_config(None, "p") == {}
    with pytest.raises(InvalidServiceConfig, match=r"^p\.decayTime: unknown field for p2c_ewma"):
        cls.parse_config({"decayTime": "5s"}, "p")
    assert cls().slow_start.window == 0.0


def test_the_ramp_is_linear_with_a_floor():
    ramp = slow_start.SlowStart(10.0, random.Random(1))
    assert [ramp.factor(100.0, 100.0 + t) for t in (0.0, 0.5, 1.0, 5.0, 9.0, 10.0, 60.0)] == pytest.approx(
        [0.1, 0.1, 0.1, 0.5, 0.9, 1.0, 1.0])
    assert ramp.admits(slow_start.NOT_RAMPING, 100.0)
    admitted = sum(ramp.admits(100.0, 102.5) for _ in range(4000)) / 4000
    assert admitted == pytest.approx(0.25, abs=0.03)


def test_backends_of_the_first_build_and_its_grace_do_not_ramp():
    ramp = slow_start.SlowStart(10.0, random.Random(1))
    assert ramp.born(5.0) == slow_start.NOT_RAMPING  # no build with backends yet
    ramp.on_build(5.0, 0)
    assert ramp.born(7.0) == slow_start.NOT_RAMPING
    ramp.on_build(10.0, 3)
    assert ramp.born(10.0 + slow_start.STARTUP_GRACE) == slow_start.NOT_RAMPING  # connecting one by one
    assert ramp.born(12.0) == 12.0
    assert slow_start.SlowStart(0.0, random.Random(1)).born(1e6) == slow_start.NOT_RAMPING


@pytest.mark.parametrize("name", RAMPED)
def test_off_draws_the_same_sequence_as_without_the_field(name):
    seqs = []
    for window in (None, "0s"):
        _, picker, _ = warmed(name, window)
        seqs.append([picker.pick(PickInfo()).backend.address for _ in range(50)])
    assert seqs[0] == seqs[1]


@pytest.mark.parametrize("name", RAMPED)
def test_a_newcomer_ramps_from_a_tenth_to_its_full_share(name):
    base, picker, clock = warmed(name, None)
    full = share_of(base, picker, "d", clock)
    policy, picker, clock = warmed(name, "10s")
    start = share_of(policy, picker, "d", clock)  # the clock stays at the window's start: factor 0.1
    clock.now += 5.0
    half = share_of(policy, picker, "d", clock)
    clock.now += 5.0
    after = share_of(policy, picker, "d", clock)
    assert full > 0.15, full
    assert start < 0.25 * full, (start, full)  # about a tenth
    assert start < half < after, (start, half, after)
    assert after == pytest.approx(full, abs=0.06)
    assert start > 0, "never starved"


@pytest.mark.parametrize("name", RAMPED)
def test_a_backend_that_leaves_and_comes_back_ramps_again(name):
    policy, picker, clock = warmed(name, "10s")
    clock.now += 20.0
    assert share_of(policy, picker, "d", clock) > 0.15
    policy.build(bs(OLD))
    clock.now += 1.0
    picker = policy.build(bs(*OLD, "d"))
    assert share_of(policy, picker, "d", clock) < 0.1


def test_prequal_pool_choices_ramp_too():
    clock = FakeClock(100.0)
    shares = []
    for window in (None, "10s"):
        cls = get_policy("prequal")
        cfg = cls.parse_config({"probesPerPick": 0, "reuseBudget": 1000, **({} if window is None else
                                                                             {"slowStartWindow": window})}, "p")
        policy = cls(cfg, clock=clock, rng=random.Random(5))
        policy.build(bs(OLD))
        clock.now += 5.0
        picker = policy.build(bs(*OLD, "d"))
        for addr, latency in (("a", 0.020), ("b", 0.020), ("c", 0.020), ("d", 0.002)):
            policy.on_probe(addr, 0, latency)  # d: the best probe by far
        got: Counter[str] = Counter()
        for _ in range(300):
            res = picker.pick(PickInfo())
            got[res.backend.address] += 1
            res.done(Outcome(OK, 0.010))
        shares.append(got["d"] / 300)
        assert policy.probe_picks > 0
    assert shares[0] > 0.9 and shares[1] < 0.3, shares
