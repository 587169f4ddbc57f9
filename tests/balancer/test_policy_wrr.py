"""smooth_weighted_round_robin: nginx smooth WRR sequences and dynamic weights (seed 002)."""

from __future__ import annotations

import logging
import random
from collections import Counter

import grpc
import pytest

from waypost.balancer.base import Outcome, PickError, PickInfo
from waypost.balancer.policies import get_policy
from waypost.balancer.smooth_weighted_round_robin import DEFAULT_WEIGHT, parse_weight
from waypost.balancer.weights import DRAINED, weight_of
from waypost.errors import NoBackendAvailable
from waypost.types import Backend

FAIL = Outcome(grpc.StatusCode.UNAVAILABLE, 0.01)
OK = Outcome(grpc.StatusCode.OK, 0.01)


def wb(addr: str, weight=None) -> Backend:
    return Backend(addr, {} if weight is None else {"weight": weight})


def policy():
    return get_policy("smooth_weighted_round_robin")(rng=random.Random(0))


def run(picker, n: int, outcome: Outcome | None = None) -> list[str]:
    out = []
    for _ in range(n):
        res = picker.pick(PickInfo())
        out.append(res.backend.address)
        if outcome is not None:
            res.done(outcome)
    return out


def test_10_20_30_gives_c_b_a_c_b_c():
    picker = policy().build([wb("A", 10), wb("B", 20), wb("C", 30)])
    assert run(picker, 12) == list("CBACBC") * 2


def test_seed_example_penalty_on_a():
    """Seed 002 section 7: A=30, B=10 -> A A B A; one penalty on A -> A B A B, A's weight 15."""
    p = policy()
    picker = p.build([wb("A", 30), wb("B", 10)])
    results = [picker.pick(PickInfo()) for _ in range(4)]
    assert [r.backend.address for r in results] == list("AABA")
    results[0].done(FAIL)  # one failed call on A halves its weight and resets its current weight
    assert p.effective_weights() == {"A": 15, "B": 10}
    assert run(picker, 4) == list("ABAB")


def test_weight_recovers_one_per_success_up_to_configured():
    p = policy()
    picker = p.build([wb("A", 30), wb("B", 10)])
    res = picker.pick(PickInfo())
    assert res.backend.address == "A"
    res.done(FAIL)
    assert p.effective_weights()["A"] == 15
    for expected in range(16, 31):
        r = picker.pick(PickInfo())
        while r.backend.address != "A":
            r.done(OK)
            r = picker.pick(PickInfo())
        r.done(OK)
        assert p.effective_weights()["A"] == expected
    r = picker.pick(PickInfo())
    r.done(OK)
    assert p.effective_weights()["A"] == 30  # capped at the configured weight


def test_penalty_floor_is_one():
    p = policy()
    picker = p.build([wb("A", 5), wb("B", 5)])
    for _ in range(10):
        res = picker.pick(PickInfo())
        res.done(FAIL)
    w = p.effective_weights()
    assert min(w.values()) == 1 and all(v >= 1 for v in w.values())
    assert set(run(picker, 4)) == {"A", "B"}  # weight 1 each: both still selected


def test_non_failure_codes_do_not_penalise():
    p = policy()
    picker = p.build([wb("A", 30), wb("B", 10)])
    for code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.CANCELLED):
        picker.pick(PickInfo()).done(Outcome(code, 0.01))
    assert p.effective_weights() == {"A": 30, "B": 10}


def test_weights_default_and_invalid(caplog):
    caplog.set_level(logging.WARNING, logger="waypost.balancer.smooth_weighted_round_robin")
    p = policy()
    bs = [wb("A"), wb("B", "50"), wb("C", 0), wb("D", -3), wb("E", "heavy"), wb("F", True), wb("G", 2.5)]
    picker = p.build(bs)
    # missing or unparsable: the default; 0: drained; negative: a mistake, drained too (never the default)
    assert p.effective_weights() == {"A": 100, "B": 50, "C": 0, "D": 0, "E": 100, "F": 100, "G": 100}
    warned = {r.getMessage().split()[1]: r.getMessage() for r in caplog.records}
    assert sorted(warned) == ["D:", "E:", "F:", "G:"] and len(caplog.records) == 4  # a weight of 0 is no mistake
    assert "negative" in warned["D:"] and "drained" in warned["D:"]
    assert "not a number" in warned["E:"] and f"default weight {DEFAULT_WEIGHT}" in warned["E:"]
    caplog.clear()
    p.build(bs)  # a rebuild with the same metadata warns no more
    assert caplog.records == []
    counts = Counter(run(picker, 450, OK))
    assert counts == {"A": 100, "B": 50, "E": 100, "F": 100, "G": 100}


def test_parse_weight():
    assert parse_weight({}) is None
    assert parse_weight({"weight": 7}) == 7
    assert parse_weight({"weight": " 12 "}) == 12
    assert parse_weight({"weight": b"3"}) == 3
    assert parse_weight({"weight": 4.0}) == 4
    for zero in (0, "0", b" 0 ", 0.0, "-0"):
        assert parse_weight({"weight": zero}) == 0
    for bad in (-1, "x", None, True, 1.5, float("inf"), "nan", [1]):
        with pytest.raises(ValueError):
            parse_weight({"weight": bad})
    assert DEFAULT_WEIGHT == 100


def test_weight_of_decides_what_a_weight_means():
    assert weight_of({}) == (100, None)
    assert weight_of({"weight": "20"}) == (20, None)
    assert weight_of({"weight": 0}) == (DRAINED, None)
    weight, problem = weight_of({"weight": -5})
    assert weight == DRAINED and problem is not None and "negative" in problem
    for unparsable in ("heavy", 2.5, None, True):
        weight, problem = weight_of({"weight": unparsable})
        assert weight == DEFAULT_WEIGHT and problem is not None and "default weight 100" in problem


def test_zero_weight_is_never_picked():
    """A=0, B=10: every pick goes to B (the drained A once got 100 of every 110)."""
    picker = policy().build([wb("A", 0), wb("B", 10)])
    assert Counter(run(picker, 110, OK)) == {"B": 110}


def test_zero_weight_is_never_picked_under_failures_and_rebuilds():
    """Seeded: random weights (some 0), random outcomes that halve and reset current weights, random
    rebuilds; a drained backend never gets a pick and the others share by their weights."""
    rng = random.Random(1616)
    codes = [grpc.StatusCode.OK] * 4 + [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
    for _ in range(30):
        p = policy()
        weights = {f"10.0.0.{i}:1": rng.choice([0, 0, 1, 3, 10, 100]) for i in range(rng.randint(2, 6))}
        if not any(weights.values()):
            weights["10.0.0.9:1"] = 5
        drained = {a for a, w in weights.items() if w == 0}
        picker = p.build([wb(a, w) for a, w in weights.items()])
        held = []
        for n in range(400):
            res = picker.pick(PickInfo())
            assert res.backend.address not in drained
            held.append(res)
            if rng.random() < 0.5:  # calls end out of order, some after a rebuild
                held.pop(rng.randrange(len(held))).done(Outcome(rng.choice(codes), 0.01))
            if n % 97 == 0:
                picker = p.build([wb(a, w) for a, w in rng.sample(list(weights.items()), len(weights))])
        for res in held:
            res.done(OK)
        assert all(p.effective_weights()[a] == 0 for a in drained)


def test_every_backend_drained_fails_unavailable_naming_the_cause():
    picker = policy().build([wb("A", 0), wb("B", "0"), wb("C", -1)])
    with pytest.raises(PickError) as ei:
        picker.pick(PickInfo())
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert "every backend has weight 0" in ei.value.message and "3 READY backends" in ei.value.message


def test_drain_and_undrain_at_runtime():
    p = policy()
    first = p.build([wb("A", 10), wb("B", 10)])
    in_flight = first.pick(PickInfo())
    assert in_flight.backend.address == "A"
    picker = p.build([wb("A", 0), wb("B", 10)])  # A drained while a call on it is in flight
    in_flight.done(FAIL)  # its end neither revives nor penalises the drained A
    assert p.effective_weights() == {"A": 0, "B": 10}
    assert Counter(run(picker, 20, OK)) == {"B": 20}
    picker = p.build([wb("A", 30), wb("B", 10)])  # undrained with a new weight
    assert p.effective_weights() == {"A": 30, "B": 10}
    assert Counter(run(picker, 40, OK)) == {"A": 30, "B": 10}


def test_stats_survive_rebuild_and_removed_start_fresh():
    p = policy()
    picker = p.build([wb("A", 30), wb("B", 10), wb("C", 10)])
    res = picker.pick(PickInfo())
    assert res.backend.address == "A"
    res.done(FAIL)
    p.build([wb("A", 30), wb("B", 10)])  # C leaves
    assert p.effective_weights() == {"A": 15, "B": 10}
    p.build([wb("B", 10)])
    p.build([wb("A", 30), wb("B", 10)])  # A comes back: fresh
    assert p.effective_weights() == {"A": 30, "B": 10}


def test_done_from_old_picker_updates_kept_backend():
    p = policy()
    old = p.build([wb("A", 30), wb("B", 10)])
    res = old.pick(PickInfo())
    new = p.build([wb("A", 30), wb("B", 10), wb("C", 10)])
    res.done(FAIL)
    assert p.effective_weights()["A"] == 15
    assert "A" in run(new, 4)


def test_changed_weight_in_metadata_applies():
    p = policy()
    p.build([wb("A", 30), wb("B", 10)])
    picker = p.build([wb("A", 10), wb("B", 10)])
    assert p.effective_weights() == {"A": 10, "B": 10}
    assert Counter(run(picker, 20, OK)) == {"A": 10, "B": 10}


def test_sequence_is_proportional_and_smooth():
    picker = policy().build([wb("A", 1), wb("B", 2), wb("C", 7)])
    seq = run(picker, 100, OK)
    assert Counter(seq) == {"A": 10, "B": 20, "C": 70}
    assert "CCCC" not in "".join(seq)  # smooth: 7 of 10 never bunch up more than 3 in a row


def test_empty_raises():
    with pytest.raises(NoBackendAvailable):
        policy().build([]).pick(PickInfo())
