"""The power-of-choices draws (``balancer.p2c``): distinct uniform pairs, draws with replacement, and the rng
order the P2C policies' seeded pick sequences rest on."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.balancer.support import bs
from waypost.balancer import p2c
from waypost.balancer.base import PickInfo
from waypost.balancer.p2c_ewma import P2CEwmaPolicy
from waypost.balancer.peak_ewma import PeakEwmaPolicy


def test_pair_is_two_distinct_indices_uniform_over_ordered_pairs():
    rng = random.Random(7)
    got = Counter(p2c.pair(rng, 4) for _ in range(24_000))
    assert all(a != b for a, b in got)
    assert len(got) == 12  # every ordered pair of 4 indices
    assert all(1700 < c < 2300 for c in got.values()), got  # 2000 each, within a few sigma


def test_pair_of_two_is_both_in_either_order():
    rng = random.Random(1)
    assert {p2c.pair(rng, 2) for _ in range(50)} == {(0, 1), (1, 0)}


def test_pair_draws_first_over_n_then_over_the_others():
    # the order a seeded rng is read in: randrange(n), then randrange(n - 1) moved past the first
    rng, ref = random.Random(11), random.Random(11)
    for _ in range(100):
        a = ref.randrange(5)
        b = ref.randrange(4)
        assert p2c.pair(rng, 5) == (a, b + 1 if b >= a else b)


def test_choices_draws_with_replacement_one_rng_call_each():
    rng, ref = random.Random(3), random.Random(3)
    drawn = [p2c.choices(rng, 3, 4) for _ in range(200)]
    assert drawn == [[ref.randrange(3) for _ in range(4)] for _ in range(200)]
    assert any(len(set(d)) < 4 for d in drawn)  # repeats happen (3 indices, 4 draws: always)


def test_distinct_draws_distinct_indices_through_sample():
    rng, ref = random.Random(8), random.Random(8)
    drawn = [p2c.distinct(rng, 6, 4) for _ in range(100)]
    assert drawn == [ref.sample(range(6), 4) for _ in range(100)]
    assert all(len(set(d)) == 4 for d in drawn)
    assert sorted(p2c.distinct(rng, 3, 4)) == [0, 1, 2]  # fewer backends than choices: all of them


def test_peak_ewma_draws_its_choices_distinct():
    # peak_ewma's default best of 4 over 6 idle backends picks one of the 4 the same seeded rng gives
    picker = PeakEwmaPolicy(rng=random.Random(5), clock=lambda: 0.0).build(bs("a", "b", "c", "d", "e", "f"))
    ref = random.Random(5)
    for _ in range(50):
        drawn = p2c.distinct(ref, 6, 4)
        assert picker.pick(PickInfo()).backend.address in {"abcdef"[i] for i in drawn}


def test_p2c_policies_draw_through_the_shared_pair():
    # p2c_ewma, and peak_ewma with choiceCount 2, over 5 idle backends pick one of the drawn pair, so each pick is
    # in the pair the same seeded rng gives
    for cls, cfg in ((PeakEwmaPolicy, {"choiceCount": 2}), (P2CEwmaPolicy, None)):
        picker = cls(cfg, rng=random.Random(5), clock=lambda: 0.0).build(bs("a", "b", "c", "d", "e"))
        ref = random.Random(5)
        for _ in range(50):
            a, b = p2c.pair(ref, 5)
            assert picker.pick(PickInfo()).backend.address in {"abcde"[a], "abcde"[b]}


def test_weighted_draw_follows_the_weights_one_randrange_of_the_total_each():
    rng, ref = random.Random(4), random.Random(4)
    draws = p2c.WeightedDraw([10, 20, 30])
    got = [draws.draw(rng) for _ in range(600)]
    # index i owns [sum of the weights before it, that sum + its weight) of randrange(total)
    assert got == [0 if r < 10 else 1 if r < 30 else 2 for r in (ref.randrange(60) for _ in range(600))]
    counts = Counter(draws.draw(rng) for _ in range(60_000))
    assert all(abs(counts[i] / 60_000 - w / 60) < 0.01 for i, w in enumerate([10, 20, 30])), counts


def test_weighted_pair_may_draw_one_index_twice():
    rng = random.Random(2)
    pairs = Counter(p2c.WeightedDraw([100, 10]).pair(rng) for _ in range(12_100))
    assert 9_600 < pairs[(0, 0)] < 10_400  # (10/11)^2 of the pairs: 10,000
    assert pairs[(1, 1)] < 250  # (1/11)^2: 100


def test_weighted_other_never_returns_the_given_index_and_weighs_the_rest():
    rng = random.Random(9)
    draws = p2c.WeightedDraw([10, 20, 30, 40])
    for i in range(4):
        others = Counter(draws.other(rng, i) for _ in range(9_000))
        assert i not in others
        rest = {j: w for j, w in enumerate([10, 20, 30, 40]) if j != i}
        for j, w in rest.items():
            assert abs(others[j] / 9_000 - w / sum(rest.values())) < 0.02, (i, others)


def test_weighted_draw_rejects_a_weight_that_is_not_positive():
    with pytest.raises(ValueError, match="positive"):
        p2c.WeightedDraw([10, 0])


def test_prefer_takes_the_lower_load_more_often_the_more_it_is_lower():
    rng = random.Random(1)
    assert not p2c.prefer(rng, 0.0, 5.0) and p2c.prefer(rng, 5.0, 0.0)  # a zero load: no draw, the lower
    assert not p2c.prefer(rng, 2.0, 2.0)  # a tie: the first drawn
    near = sum(p2c.prefer(rng, 1.01, 1.0) for _ in range(10_000)) / 10_000
    far = sum(p2c.prefer(rng, 2.0, 1.0) for _ in range(10_000)) / 10_000
    assert 0.49 < near < 0.53  # a hair's difference is no reason to break the weights' share
    assert far > 0.93  # 16/17 at SHARPNESS 4: twice the load almost always loses
