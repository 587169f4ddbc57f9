"""prequal's probe pool and HCL choice, on a fake clock and a seeded random source."""

from __future__ import annotations

import random

import pytest

from tests.balancer.support import FakeClock
from waypost.balancer.prequal_pool import Probe, ProbePool


def Clock() -> FakeClock:
    return FakeClock(100.0)


def pool(clock: FakeClock, **kw) -> ProbePool:
    return ProbePool(clock=clock, rng=random.Random(7), **kw)


ALL = {"a", "b", "c", "d", "e"}


def test_cold_probe_with_lowest_latency_wins_over_a_hot_faster_one() -> None:
    clock = Clock()
    p = pool(clock, rif_quantile=0.5, reuse_budget=10)
    # history RIFs 1, 2, 9 -> the 0.5 quantile is 2: 'c' (RIF 9) is hot even though its latency estimate is lowest
    p.add(Probe("a", 1, 0.030, clock.now))
    p.add(Probe("b", 2, 0.010, clock.now))
    p.add(Probe("c", 9, 0.001, clock.now))
    assert p.choose(ALL).address == "b"


def test_all_hot_picks_the_fewest_in_flight() -> None:
    clock = Clock()
    p = pool(clock, rif_quantile=0.5, reuse_budget=10, history=8)
    for rif in (0, 0, 0, 0, 0):  # a calm history...
        p.add(Probe("x", rif, 0.001, clock.now))
    p.discard("x")
    p.add(Probe("a", 7, 0.001, clock.now))  # ...then every probe in the pool is above it
    p.add(Probe("b", 5, 0.050, clock.now))
    assert p.choose(ALL, hot_choice=False) is None  # the caller may decide otherwise: nothing is used
    assert [q.uses for q in p.probes()] == [0, 0]
    assert p.choose(ALL).address == "b"


def test_a_use_adds_our_own_request_and_spends_the_budget() -> None:
    clock = Clock()
    p = pool(clock, rif_quantile=1.0, reuse_budget=2)
    p.add(Probe("a", 0, 0.001, clock.now))
    p.add(Probe("b", 0, 0.002, clock.now))
    first = p.choose(ALL)
    assert (first.address, first.inflight, first.uses) == ("a", 0, 1)
    # a now has our call in flight (one use), above every RIF reported (0): hot, so the burst moves to b
    assert p.choose(ALL).address == "b"
    third = p.choose(ALL)  # both hot with one in flight: the tie is drawn, and that probe's budget is spent
    assert third.uses == 2 and [q.address for q in p.probes()] == sorted({"a", "b"} - {third.address})


def test_our_part_of_the_rif_is_brought_up_to_date() -> None:
    clock = Clock()
    p = pool(clock, rif_quantile=1.0, reuse_budget=10)
    p.add(Probe("a", 3, 0.001, clock.now, own=2))  # a reported 3 calls, 2 of them ours
    p.add(Probe("b", 1, 0.002, clock.now, own=0))  # hot above 3 (the largest RIF reported)
    mine = {"a": 2, "b": 0}
    assert p.choose(ALL, own=mine.__getitem__).address == "a"  # nothing new since a's report: cold, fastest
    mine["a"] = 3  # one more call of ours started there since: 4 > 3, hot
    assert p.choose(ALL, own=mine.__getitem__).address == "b"
    mine["a"] = 0  # our calls there ended: 1 left (the other client's), cold again
    assert p.choose(ALL, own=mine.__getitem__).address == "a"


def test_latency_grows_with_our_calls_since_the_report() -> None:
    clock = Clock()
    p = pool(clock, rif_quantile=1.0, reuse_budget=10)
    p.add(Probe("x", 5, 0.1, clock.now))  # a history wide enough that nothing below is hot
    p.discard("x")
    p.add(Probe("a", 0, 0.0010, clock.now))
    p.add(Probe("b", 0, 0.0025, clock.now))
    mine = {"a": 1, "b": 0}
    assert p.choose(ALL, own=mine.__getitem__).address == "a"  # 1 ms x (1 + 1) / (0 + 1) = 2 ms < 2.5 ms
    mine["a"] = 2
    assert p.choose(ALL, own=mine.__getitem__).address == "b"  # 3 ms > 2.5 ms


def test_min_choice_refuses_a_lone_leftover_probe() -> None:
    clock = Clock()
    p = pool(clock)
    p.add(Probe("a", 0, 0.040, clock.now))
    assert p.choose(ALL, min_choice=2) is None and len(p) == 1  # not used
    p.add(Probe("b", 0, 0.001, clock.now))
    assert p.choose(ALL, min_choice=2).address == "b"


def test_stale_probes_expire_oldest_first() -> None:
    clock = Clock()
    p = pool(clock, max_age=1.0)
    p.add(Probe("a", 0, 0.001, clock.now))
    clock.now += 0.6
    p.add(Probe("b", 0, 0.005, clock.now))
    clock.now += 0.6  # a is 1.2 s old, b 0.6 s
    assert p.choose(ALL).address == "b"
    assert [q.address for q in p.probes()] == ["b"]
    clock.now += 1.0
    assert p.choose(ALL) is None and len(p) == 0


def test_one_probe_per_backend_and_bounded_size() -> None:
    clock = Clock()
    p = pool(clock, size=3)
    for i, addr in enumerate(["a", "b", "a", "c", "d"]):
        p.add(Probe(addr, i, 0.001, clock.now))
    assert [q.address for q in p.probes()] == ["a", "c", "d"]  # b was the oldest when d came
    assert [q.inflight for q in p.probes()] == [2, 3, 4]  # a's fresher answer replaced the older one


def test_only_usable_backends_are_chosen() -> None:
    clock = Clock()
    p = pool(clock)
    p.add(Probe("gone", 0, 0.0001, clock.now))
    p.add(Probe("b", 3, 0.050, clock.now))
    assert p.choose({"b"}).address == "b"
    assert p.choose(set()) is None


def test_ties_are_broken_by_the_random_source_not_by_order() -> None:
    clock = Clock()
    seen = set()
    for seed in range(20):
        p = ProbePool(clock=clock, rng=random.Random(seed), reuse_budget=5)
        for addr in "abcd":
            p.add(Probe(addr, 1, 0.002, clock.now))
        seen.add(p.choose(ALL).address)
    assert seen == {"a", "b", "c", "d"}


@pytest.mark.parametrize("kw", [{"size": 0}, {"max_age": 0}, {"reuse_budget": 0}, {"rif_quantile": 0},
                                {"rif_quantile": 1.5}, {"history": 0}])
def test_bad_settings_are_refused(kw) -> None:
    with pytest.raises(ValueError):
        pool(Clock(), **kw)
