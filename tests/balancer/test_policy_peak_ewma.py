"""peak_ewma: peak-sensitive EWMA x (in flight + 1), P2C; on a fake clock with a seeded rng."""

from __future__ import annotations

import math
import random
from collections import Counter

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer import peak_ewma
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig, NoBackendAvailable
from waypost.service_config import parse_service_config

OK = grpc.StatusCode.OK


def make(clock: FakeClock, seed: int = 1, **config):
    return get_policy("peak_ewma")(config, clock=clock, rng=random.Random(seed))


def sample(policy, addr: str, latency: float, code=OK) -> None:
    """One finished call on ``addr`` (through a one-backend picker: statistics survive rebuilds)."""
    res = policy.build(bs(addr)).pick(PickInfo())
    res.done(Outcome(code, latency))


def est(policy, addr: str) -> float:
    return policy.snapshot()[addr]["estimate"]


def test_registered_and_empty_picker_fails():
    clock = FakeClock(1000.0)
    p = make(clock)
    assert p.name == "peak_ewma"
    with pytest.raises(NoBackendAvailable):
        p.build([]).pick(PickInfo())


def test_new_backend_starts_at_the_default_rtt():
    clock = FakeClock(1000.0)
    p = make(clock)
    p.build(bs("a"))
    assert est(p, "a") == pytest.approx(peak_ewma.DEFAULT_RTT)


def test_a_backend_joining_a_fast_fleet_starts_at_its_peers_median():
    clock = FakeClock(1000.0)
    p = make(clock)
    rtts = {"a": 0.004, "b": 0.006, "c": 0.100}
    picker = p.build(bs("a", "b", "c"))
    for _ in range(30):
        res = picker.pick(PickInfo())
        clock.now += 0.01
        res.done(Outcome(OK, rtts[res.backend.address]))
    assert all(st["estimate"] < peak_ewma.DEFAULT_RTT or a == "c" for a, st in p.snapshot().items())
    peers = sorted(est(p, a) for a in "abc")
    picker = p.build(bs("a", "b", "c", "d"))
    assert peers[1] < peak_ewma.DEFAULT_RTT
    assert est(p, "d") == pytest.approx(peers[1])  # the median, not 30 ms
    # the newcomer wins its first draw at once (not after ~7 s of decay), then takes one call at a time
    held = [picker.pick(PickInfo()) for _ in range(12)]
    assert Counter(r.backend.address for r in held)["d"] == 1


def test_a_newcomer_never_starts_above_the_default_rtt():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.001, code=grpc.StatusCode.UNAVAILABLE)  # a failing peer: estimate 1 s
    p.build(bs("a", "b"))
    assert est(p, "b") == pytest.approx(peak_ewma.DEFAULT_RTT)


def test_a_peak_replaces_the_estimate_at_once():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.010)
    clock.now += 0.001
    sample(p, "a", 0.500)
    assert est(p, "a") == pytest.approx(0.500)


def test_lower_samples_come_in_with_a_time_weight():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.100)  # peak over the 30 ms default: 100 ms at t0
    clock.now += 1.0
    sample(p, "a", 0.010)
    w = math.exp(-1.0 / peak_ewma.DEFAULT_DECAY_TIME)
    assert est(p, "a") == pytest.approx(0.100 * w + 0.010 * (1 - w))


def test_the_estimate_decays_towards_zero_without_samples():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.200)
    clock.now += peak_ewma.DEFAULT_DECAY_TIME
    assert est(p, "a") == pytest.approx(0.200 / math.e)
    clock.now += 100 * peak_ewma.DEFAULT_DECAY_TIME
    assert est(p, "a") == pytest.approx(0.0, abs=1e-12)


def test_decay_time_is_configurable():
    clock = FakeClock(1000.0)
    p = make(clock, decayTime=1.0)
    sample(p, "a", 0.200)
    clock.now += 1.0
    assert est(p, "a") == pytest.approx(0.200 / math.e)


def test_load_multiplies_by_in_flight_plus_one_and_penalises_a_zero_estimate():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", peak_ewma.DEFAULT_RTT)
    picker = p.build(bs("a"))
    held = [picker.pick(PickInfo()) for _ in range(3)]
    assert p.snapshot()["a"]["load"] == pytest.approx(peak_ewma.DEFAULT_RTT * 4)
    clock.now += 10_000 * peak_ewma.DEFAULT_DECAY_TIME  # decayed to zero with 3 in flight, none answered:
    silent = 10_000 * peak_ewma.DEFAULT_DECAY_TIME  # ... the age of the calls is the estimate's floor (failure)
    assert p.snapshot()["a"]["load"] == pytest.approx(silent * 4)
    for r in held:
        r.done(Outcome(OK, 0.01))
    one = picker.pick(PickInfo())  # one call in flight since the last answer: no silence (it may be a stream)
    clock.now += 10_000 * peak_ewma.DEFAULT_DECAY_TIME
    assert p.snapshot()["a"]["load"] == peak_ewma.PENALTY + 1
    one.done(Outcome(OK, 0.01))
    assert p.snapshot()["a"]["inflight"] == 0


def test_a_failed_call_never_makes_a_backend_look_fast_and_adds_a_penalty():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.100)
    sample(p, "a", 0.001, code=grpc.StatusCode.UNAVAILABLE)
    assert est(p, "a") == pytest.approx(0.100)  # not averaged down by the fast failure
    assert p.snapshot()["a"]["load"] > 0.100 * 10  # the penalty: ten calls' worth (failure.FAILURE_WEIGHT)
    sample(p, "a", 0.500, code=grpc.StatusCode.UNAVAILABLE)  # nor slow: its penalty says it fails
    assert est(p, "a") == pytest.approx(0.100)
    sample(p, "b", 0.001, code=grpc.StatusCode.NOT_FOUND)  # the request's fault: it says "slow" at most
    assert est(p, "b") == pytest.approx(peak_ewma.DEFAULT_RTT)
    sample(p, "b", 0.002)
    assert est(p, "b") == pytest.approx(0.002)  # the first reply sets the estimate


def test_a_never_measured_backend_is_free_while_idle_then_gets_one_call_at_a_time():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.001)  # a fast, measured backend
    picker = p.build(bs("a", "b"))
    assert p.snapshot()["b"]["load"] == 0.0  # not measured, idle: it wins its draws
    first = [picker.pick(PickInfo()) for _ in range(2)]
    assert sorted(r.backend.address for r in first) == ["a", "b"]  # b got one call (a won the second draw)
    assert p.snapshot()["b"]["load"] == peak_ewma.PENALTY + 1  # ...and no more until it answers
    assert {picker.pick(PickInfo()).backend.address for _ in range(10)} == {"a"}
    next(r for r in first if r.backend.address == "b").done(Outcome(OK, 0.002))
    assert est(p, "b") == pytest.approx(0.002)  # measured: its first reply, not an average with 30 ms


def test_p2c_prefers_the_lower_cost_and_avoids_a_slow_backend():
    clock = FakeClock(1000.0)
    p = make(clock, seed=7)
    addrs = ["a", "b", "c", "d"]
    for a in addrs[:3]:
        sample(p, a, 0.004)
    sample(p, "d", 0.040)
    picker = p.build(bs(*addrs))
    counts: Counter[str] = Counter()
    for _ in range(3000):  # sequential calls: nothing in flight, pure latency comparison
        clock.now += 0.001
        r = picker.pick(PickInfo())
        counts[r.backend.address] += 1
        r.done(Outcome(OK, 0.040 if r.backend.address == "d" else 0.004))
    assert counts["d"] == 0  # d is one of every pair only against a faster backend
    assert min(counts[a] for a in addrs[:3]) > 700


def test_in_flight_calls_spread_the_load():
    clock = FakeClock(1000.0)
    p = make(clock, seed=3)
    picker = p.build(bs("a", "b"))
    held = [picker.pick(PickInfo()) for _ in range(10)]  # equal estimates: in flight decides
    counts = Counter(r.backend.address for r in held)
    assert abs(counts["a"] - counts["b"]) <= 1


def test_statistics_survive_rebuilds_and_late_dones():
    clock = FakeClock(1000.0)
    p = make(clock)
    sample(p, "a", 0.300)
    r = p.build(bs("a", "b")).pick(PickInfo())
    p.build(bs("a", "b", "c"))
    assert est(p, r.backend.address) > 0
    r.done(Outcome(OK, 0.001))  # a done after a rebuild still updates that backend
    assert p.snapshot()[r.backend.address]["inflight"] == 0
    assert est(p, "a") > peak_ewma.DEFAULT_RTT


def test_config_is_validated_through_the_service_config():
    sc = parse_service_config({"loadBalancingConfig": [{"peak_ewma": {"decayTime": "5s", "defaultRtt": "0.01s"}}]})
    assert sc.lb_policy == "peak_ewma"
    with pytest.raises(InvalidServiceConfig, match="decayTime"):
        parse_service_config({"loadBalancingConfig": [{"peak_ewma": {"decayTime": "0s"}}]})
    with pytest.raises(InvalidServiceConfig, match="unknown field"):
        parse_service_config({"loadBalancingConfig": [{"peak_ewma": {"window": "5s"}}]})


def test_choice_count_is_validated_for_peak_ewma_and_prequal_s_fallback():
    for name in ("peak_ewma", "prequal"):
        sc = parse_service_config({"loadBalancingConfig": [{name: {"choiceCount": 3}}]})
        assert sc.lb_policy == name
        for bad in (1, 11, "3", True, 2.5):
            with pytest.raises(InvalidServiceConfig, match=r"choiceCount: expected an integer from 2 to 10"):
                parse_service_config({"loadBalancingConfig": [{name: {"choiceCount": bad}}]})


def test_best_of_k_takes_the_lowest_load_of_its_draw():
    # 6 backends with the same estimate, calls held: with choiceCount 6 every pick compares all of them, so it takes
    # one with the fewest calls in flight and the counts never differ by more than one; a slow one is never taken
    clock = FakeClock()
    p = get_policy("peak_ewma")({"choiceCount": 6}, clock=clock, rng=random.Random(3))
    picker = p.build(bs("a", "b", "c", "d", "e", "f"))
    first = [picker.pick(PickInfo()) for _ in range(6)]  # never measured: one call each until it answers
    assert sorted(r.backend.address for r in first) == list("abcdef")
    for r in first:
        r.done(Outcome(OK, 0.01))
    held = []
    for _ in range(60):
        held.append(picker.pick(PickInfo()))
        inflight = [s["inflight"] for s in p.snapshot().values()]
        assert max(inflight) - min(inflight) <= 1
    assert [s["inflight"] for s in p.snapshot().values()] == [10] * 6
    for r in held:
        r.done(Outcome(OK, 0.1 if r.backend.address == "f" else 0.01))  # "f" answered 10x slower
    picks: Counter[str] = Counter()
    for _ in range(60):
        r = picker.pick(PickInfo())
        picks[r.backend.address] += 1
        r.done(Outcome(OK, 0.01))
    assert picks["f"] == 0 and set(picks) == set("abcde")
