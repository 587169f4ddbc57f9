"""least_request: power of choiceCount choices on in-flight calls (gRPC A48)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.balancer.support import bs
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig


def test_exact_choices_follow_the_rng():
    addrs = ["a", "b", "c", "d"]
    policy = get_policy("least_request")({"choiceCount": 3}, rng=random.Random(11))
    picker = policy.build(bs(*addrs))
    ref = random.Random(11)
    inflight = dict.fromkeys(addrs, 0)
    held = []
    for _ in range(40):
        best = ref.randrange(4)
        for _ in range(2):
            i = ref.randrange(4)
            if inflight[addrs[i]] < inflight[addrs[best]]:
                best = i
        res = picker.pick(PickInfo())
        assert res.backend.address == addrs[best]
        inflight[addrs[best]] += 1
        held.append(res)
    assert policy.inflight() == inflight
    for r in held:
        r.done(Outcome())
    assert set(policy.inflight().values()) == {0}


def test_prefers_fewer_inflight():
    policy = get_policy("least_request")({"choiceCount": 10}, rng=random.Random(2))
    picker = policy.build(bs("busy", "idle"))
    held = [picker.pick(PickInfo()) for _ in range(2)]  # one each, or both on one
    assert Counter(r.backend.address for r in held) == {"busy": 1, "idle": 1}
    # make "busy" busier by holding calls picked from a single-backend build (counts survive rebuilds)
    lone = policy.build(bs("busy", "gone"))
    extra = []
    while len(extra) < 5:
        r = lone.pick(PickInfo())
        if r.backend.address == "busy":
            extra.append(r)
        else:
            r.done(Outcome())
    picker = policy.build(bs("busy", "idle"))
    got = Counter()
    for _ in range(5):
        r = picker.pick(PickInfo())
        got[r.backend.address] += 1
        held.append(r)
    # with 10 draws out of 2 the idle one is nearly always among them: "idle" fills up to "busy"'s level
    assert got["idle"] >= 4
    for r in held + extra:
        r.done(Outcome())
    assert policy.inflight() == {"busy": 0, "idle": 0}


def test_even_spread_when_calls_end_at_once():
    policy = get_policy("least_request")(rng=random.Random(4))
    picker = policy.build(bs("a", "b", "c"))
    counts = Counter()
    for _ in range(3000):
        r = picker.pick(PickInfo())
        counts[r.backend.address] += 1
        r.done(Outcome())
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 800


def test_inflight_survives_rebuild_and_old_done_decrements():
    policy = get_policy("least_request")(rng=random.Random(1))
    old = policy.build(bs("a"))
    held = [old.pick(PickInfo()) for _ in range(3)]
    policy.build(bs("a", "b"))
    assert policy.inflight() == {"a": 3, "b": 0}
    for r in held:
        r.done(Outcome())
    assert policy.inflight() == {"a": 0, "b": 0}


@pytest.mark.parametrize("n", [2, 5, 10, 10.0])
def test_choice_count_valid(n):
    cfg = get_policy("least_request").parse_config({"choiceCount": n}, "lb[0].least_request")
    assert cfg == {"choiceCount": int(n)}
    assert get_policy("least_request")(cfg).choice_count == int(n)


@pytest.mark.parametrize("n", [0, 1, 11, -2, "3", 2.5, True, None])
def test_choice_count_invalid(n):
    with pytest.raises(InvalidServiceConfig, match=r"lb\[0\]\.least_request\.choiceCount"):
        get_policy("least_request").parse_config({"choiceCount": n}, "lb[0].least_request")


def test_default_choice_count_and_unknown_field():
    assert get_policy("least_request")().choice_count == 2
    with pytest.raises(InvalidServiceConfig, match=r"p\.choices: unknown field"):
        get_policy("least_request").parse_config({"choices": 2}, "p")
