"""The power-of-choices draws (``balancer.p2c``): distinct uniform pairs, draws with replacement, and the rng
order the P2C policies' seeded pick sequences rest on."""

from __future__ import annotations

import random
from collections import Counter

from tests.policy_support import bs
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


def test_p2c_policies_draw_through_the_shared_pair():
    # peak_ewma and p2c_ewma over 5 idle backends pick one of the drawn pair, so each pick is in the pair
    # the same seeded rng gives
    for cls in (PeakEwmaPolicy, P2CEwmaPolicy):
        picker = cls(rng=random.Random(5), clock=lambda: 0.0).build(bs("a", "b", "c", "d", "e"))
        ref = random.Random(5)
        for _ in range(50):
            a, b = p2c.pair(ref, 5)
            assert picker.pick(PickInfo()).backend.address in {"abcde"[a], "abcde"[b]}
