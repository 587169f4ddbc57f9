"""weighted_round_robin: nginx smooth WRR sequences and dynamic weights (seed 002)."""

from __future__ import annotations

import logging
import random
from collections import Counter

import grpc
import pytest

from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.balancer.weighted_round_robin import DEFAULT_WEIGHT, parse_weight
from waypost.errors import NoBackendAvailable
from waypost.types import Backend

FAIL = Outcome(grpc.StatusCode.UNAVAILABLE, 0.01)
OK = Outcome(grpc.StatusCode.OK, 0.01)


def wb(addr: str, weight=None) -> Backend:
    return Backend(addr, {} if weight is None else {"weight": weight})


def policy():
    return get_policy("weighted_round_robin")(rng=random.Random(0))


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
    caplog.set_level(logging.WARNING, logger="waypost.balancer.wrr")
    p = policy()
    bs = [wb("A"), wb("B", "50"), wb("C", 0), wb("D", -3), wb("E", "heavy"), wb("F", True), wb("G", 2.5)]
    picker = p.build(bs)
    assert p.effective_weights() == {"A": 100, "B": 50, "C": 100, "D": 100, "E": 100, "F": 100, "G": 100}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 5 and all(m.split()[1] in "C: D: E: F: G:" for m in warned)
    caplog.clear()
    p.build(bs)  # a rebuild with the same metadata warns no more
    assert caplog.records == []
    counts = Counter(run(picker, 650, OK))
    assert counts == {"A": 100, "B": 50, "C": 100, "D": 100, "E": 100, "F": 100, "G": 100}


def test_parse_weight():
    assert parse_weight({}) is None
    assert parse_weight({"weight": 7}) == 7
    assert parse_weight({"weight": " 12 "}) == 12
    assert parse_weight({"weight": b"3"}) == 3
    assert parse_weight({"weight": 4.0}) == 4
    for bad in (0, -1, "x", None, True, 1.5, float("inf"), "nan", [1]):
        with pytest.raises(ValueError):
            parse_weight({"weight": bad})
    assert DEFAULT_WEIGHT == 100


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
