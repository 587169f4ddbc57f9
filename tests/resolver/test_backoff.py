"""waypost.backoff: the reconnect pauses every resolver waits between failed reads."""

from __future__ import annotations

import random

import pytest

from waypost.backoff import RECONNECT, Backoff


def test_doubles_from_first_up_to_the_cap_without_jitter():
    b = Backoff(first=0.5, cap=5.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.delay(0) == 0.5  # no failure yet counts as the first


def test_jitter_stays_within_its_band_and_follows_the_random_source():
    draws = [RECONNECT.delay(1, random.Random(seed)) for seed in range(200)]
    assert all(0.4 <= d <= 0.6 for d in draws)  # 0.5 s +-20%
    assert len(set(draws)) > 100  # spread, not one value
    assert RECONNECT.delay(3, random.Random(7)) == RECONNECT.delay(3, random.Random(7))  # injectable: repeatable
    assert all(8.0 <= RECONNECT.delay(50, random.Random(s)) <= 12.0 for s in range(50))  # the cap, jittered


def test_a_very_long_outage_stays_at_the_cap():
    # 2 ** 5000 as a float would overflow: hours of failures must not end the loop that waits
    assert Backoff(first=1.0, cap=30.0, jitter=0.0).delay(5000) == 30.0
    assert 24.0 <= Backoff(first=1.0, cap=30.0).delay(10**9, random.Random(1)) <= 36.0


@pytest.mark.parametrize("kw", [{"first": 0.0, "cap": 1.0}, {"first": 2.0, "cap": 1.0},
                                {"first": 1.0, "cap": 1.0, "jitter": 1.0}, {"first": 1.0, "cap": 1.0, "jitter": -0.1}])
def test_bad_figures_are_refused(kw):
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kw)
