"""p2c_ewma: go-zero's algorithm and constants, on a fake clock with a seeded rng."""

from __future__ import annotations

import heapq
import logging
import math
import random
from collections import Counter

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer import p2c_ewma
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy

OK = grpc.StatusCode.OK
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


def make(clock: FakeClock, seed: int = 1):
    return get_policy("p2c_ewma")(clock=clock, rng=random.Random(seed))


def sample(policy, addr: str, code=OK, latency: float = 0.001) -> None:
    """Give ``addr`` one latency sample through a single-backend picker (stats survive rebuilds)."""
    res = policy.build(bs(addr)).pick(PickInfo())
    assert res.backend.address == addr
    res.done(Outcome(code, latency))


def prime(policy, outcomes: dict[str, Outcome]) -> None:
    """Give each backend exactly one latency sample, at the current (unchanging) fake-clock time.

    All picks are held until every backend was picked once (in-flight counts spread them), then each
    backend's first call ends with its outcome; the extra calls end at the same instant, where
    td = 0 makes w = 1, so they change nothing.
    """
    picker = policy.build(bs(*outcomes))
    first: dict[str, object] = {}
    extra = []
    for _ in range(1000):
        res = picker.pick(PickInfo())
        if res.backend.address in first:
            extra.append(res.done)
        else:
            first[res.backend.address] = res.done
        if len(first) == len(outcomes):
            break
    assert len(first) == len(outcomes)
    for addr, outcome in outcomes.items():
        first[addr](outcome)  # type: ignore[operator]
    for done in extra:
        done(Outcome(OK, 123.0))


def entropy(counts: dict[str, int]) -> float:
    """go-zero's mathx.CalcEntropy: normalised Shannon entropy, probabilities floored at 1e-6."""
    if len(counts) <= 1:
        return 1.0
    total = sum(counts.values())
    h = 0.0
    for v in counts.values():
        p = max(v / total, 1e-6)
        h -= p * math.log2(p)
    return h / math.log2(len(counts))


def test_constants_match_go_zero():
    assert p2c_ewma.DECAY_TIME == 10.0
    assert p2c_ewma.FORCE_PICK == 1.0
    assert p2c_ewma.INIT_SUCCESS == 1000
    assert p2c_ewma.THROTTLE_SUCCESS == 500
    assert p2c_ewma.PICK_TIMES == 3
    assert p2c_ewma.LOG_INTERVAL == 60.0


@pytest.mark.parametrize(("candidates", "threshold"), [(1, 0.9), (2, 0.5), (100, 0.95)])
def test_go_zero_entropy_checks(candidates, threshold):
    """go-zero's TestP2cPicker_Pick: 10,000 picks, every 100th call fails with DeadlineExceeded.

    Calls overlap as in go-zero's test (their Done runs in goroutines): each ends after a random
    latency on the fake clock, which advances 50 us per pick.
    """
    clock = FakeClock(1000.0)
    policy = make(clock, seed=candidates)
    picker = policy.build(bs(*[str(i) for i in range(candidates)]))
    lat_rng = random.Random(99)
    pending: list[tuple[float, int, object, Outcome]] = []
    counts: Counter = Counter()
    for i in range(10_000):
        clock.now += 50e-6
        while pending and pending[0][0] <= clock.now:
            _, _, done, outcome = heapq.heappop(pending)
            done(outcome)  # type: ignore[operator]
        res = picker.pick(PickInfo(method="/"))
        counts[res.backend.address] += 1
        latency = lat_rng.expovariate(1 / 0.001)
        code = DEADLINE if i % 100 == 0 else OK
        heapq.heappush(pending, (clock.now + latency, i, res.done, Outcome(code, latency)))
    while pending:
        _, _, done, outcome = heapq.heappop(pending)
        done(outcome)  # type: ignore[operator]
    assert sum(counts.values()) == 10_000
    assert entropy(counts) > threshold, (entropy(counts), counts.most_common(3))
    assert all(s["inflight"] == 0 for s in policy.snapshot().values())


def test_two_backends_exact_sequence_and_force_pick():
    clock = FakeClock(100.0)
    policy = make(clock)
    picker = policy.build(bs("A", "B"))

    def pick_done(latency: float) -> str:
        res = picker.pick(PickInfo())
        res.done(Outcome(OK, latency))
        return res.backend.address

    assert pick_done(0.010) == "A"  # equal loads (no samples): the first of the pair
    assert policy.snapshot()["A"]["lag"] == 10_000_000  # first sample taken as is (w = 0)
    assert pick_done(0.001) == "B"  # load(B) = 1 < load(A) = int(sqrt(1e7 + 1)) = 3162
    assert [pick_done(0.001) for _ in range(5)] == ["B"] * 5  # time stands still: no change
    clock.now = 101.0  # exactly 1 s since A was picked: not MORE than forcePick
    assert pick_done(0.001) == "B"
    clock.now = 101.001
    assert pick_done(0.010) == "A"  # A force-picked: not picked for > 1 s
    assert pick_done(0.001) == "B"  # and B again right after


def test_ewma_update_is_time_decayed():
    clock = FakeClock(50.0)
    policy = make(clock)
    sample(policy, "A", latency=0.002)
    assert policy.snapshot()["A"] == {"lag": 2_000_000, "inflight": 0, "success": 1000, "load": 1414}
    clock.now += 5.0
    sample(policy, "A", code=DEADLINE, latency=0.010)
    w = math.exp(-5.0 / 10.0)
    snap = policy.snapshot()["A"]
    assert snap["lag"] == int(2_000_000 * w + 10_000_000 * (1 - w))
    assert snap["success"] == int(1000 * w + 0 * (1 - w))
    assert snap["success"] == 606
    clock.now += 0.0
    sample(policy, "A", latency=0.5)  # td = 0 -> w = 1: no change at all
    assert policy.snapshot()["A"]["lag"] == snap["lag"]


def test_first_sample_failure_makes_backend_unhealthy():
    clock = FakeClock(1000.0)
    policy = make(clock)
    prime(policy, {"A": Outcome(grpc.StatusCode.UNAVAILABLE, 0.001), "B": Outcome(grpc.StatusCode.NOT_FOUND, 0.001)})
    assert policy.snapshot()["A"]["success"] == 0
    assert policy.snapshot()["B"]["success"] == 1000  # NOT_FOUND is not a failure code


@pytest.mark.parametrize(
    "code",
    [DEADLINE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS,
     grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED],
)
def test_failure_codes(code):
    policy = make(FakeClock(1000.0))
    sample(policy, "A", code=code)
    assert policy.snapshot()["A"]["success"] == 0


def test_load_formula_counts_inflight():
    clock = FakeClock(1000.0)
    policy = make(clock)
    sample(policy, "A", latency=0.004)  # lag 4e6 ns -> sqrt = 2000
    picker = policy.build(bs("A"))
    held = [picker.pick(PickInfo()) for _ in range(3)]
    assert policy.snapshot()["A"]["load"] == 2000 * 4
    for r in held:
        r.done(Outcome(OK, 0.004))
    assert policy.snapshot()["A"]["load"] == 2000


def test_unhealthy_pair_avoidance_exact():
    """Backends 0 and 1 are unhealthy but fast; up to 3 draws look for a healthy pair first."""
    clock = FakeClock(1000.0)
    policy = make(clock, seed=5)
    prime(policy, {f"b{i}": Outcome(grpc.StatusCode.UNAVAILABLE if i < 2 else OK, 0.001 if i < 2 else 0.005)
                   for i in range(5)})
    snap = policy.snapshot()
    assert [snap[f"b{i}"]["success"] for i in range(5)] == [0, 0, 1000, 1000, 1000]
    load = [snap[f"b{i}"]["load"] for i in range(5)]
    assert load == [1000, 1000, 2236, 2236, 2236]
    picker = policy.build(bs(*[f"b{i}" for i in range(5)]))

    ref = random.Random()
    ref.setstate(policy.rng.getstate())
    expected = []
    for _ in range(300):
        a = b = 0
        for _ in range(3):
            a = ref.randrange(5)
            b = ref.randrange(4)
            if b >= a:
                b += 1
            if a >= 2 and b >= 2:
                break
        expected.append(b if load[b] < load[a] else a)
    got = []
    for _ in range(300):
        res = picker.pick(PickInfo())
        got.append(int(res.backend.address[1:]))
        res.done(Outcome(OK, 0.001))  # clock stands still: td = 0, w = 1, stats unchanged
    assert got == expected
    unhealthy_share = sum(1 for i in got if i < 2) / len(got)
    # plain P2C would send 70% (any pair holding an unhealthy, faster backend) to backends 0 and 1
    assert unhealthy_share < 0.5


def test_stats_survive_rebuild():
    clock = FakeClock(1000.0)
    policy = make(clock)
    prime(policy, {"A": Outcome(OK, 0.003), "B": Outcome(DEADLINE, 0.020)})
    before = policy.snapshot()
    policy.build(bs("A", "B", "C"))
    after = policy.snapshot()
    assert after["A"] == before["A"] and after["B"] == before["B"]
    assert after["C"] == {"lag": 0, "inflight": 0, "success": 1000, "load": 1}
    policy.build(bs("A", "C"))
    assert "B" not in policy.snapshot()
    policy.build(bs("A", "B", "C"))
    assert policy.snapshot()["B"]["success"] == 1000  # removed then re-added: fresh


def test_inflight_never_leaks_across_rebuilds():
    clock = FakeClock(1000.0)
    policy = make(clock)
    old = policy.build(bs("A", "B"))
    held = [old.pick(PickInfo()) for _ in range(6)]
    assert sum(s["inflight"] for s in policy.snapshot().values()) == 6
    new = policy.build(bs("A", "B", "C"))
    more = [new.pick(PickInfo()) for _ in range(3)]
    for r in held + more:
        r.done(Outcome(OK, 0.001))
    assert {a: s["inflight"] for a, s in policy.snapshot().items()} == {"A": 0, "B": 0, "C": 0}
    # a done for a backend removed meanwhile is harmless
    r = policy.build(bs("A")).pick(PickInfo())
    policy.build(bs("B"))
    r.done(Outcome(OK, 0.001))
    assert policy.snapshot() == {"B": {"lag": 0, "inflight": 0, "success": 1000, "load": 1}}  # B came back fresh


def test_new_backend_is_force_picked_within_a_second():
    """A backend that joins is compared by load; one whose load loses is still tried after 1 s."""
    clock = FakeClock(1000.0)
    policy = make(clock)
    sample(policy, "A", latency=0.001)
    picker = policy.build(bs("A", "B"))
    # B (no sample) has load 1 and wins at once
    res = picker.pick(PickInfo())
    assert res.backend.address == "B"
    res.done(Outcome(OK, 0.100))  # B is slow
    seq = []
    for _ in range(3):
        r = picker.pick(PickInfo())
        seq.append(r.backend.address)
        r.done(Outcome(OK, 0.001))
    assert seq == ["A", "A", "A"]
    clock.now += 1.5
    r = picker.pick(PickInfo())
    assert r.backend.address == "B"


def test_stats_line_once_a_minute(caplog):
    caplog.set_level(logging.INFO, logger="waypost.balancer.p2c")
    clock = FakeClock(0.0)
    policy = make(clock)
    picker = policy.build(bs("a:1", "b:1"))
    for _ in range(4):
        picker.pick(PickInfo()).done(Outcome(OK, 0.0))
    assert caplog.records == []
    clock.now = 60.0
    picker.pick(PickInfo()).done(Outcome(OK, 0.0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    # equal loads send the first four calls to a:1; at t=60 b:1 (last picked at 0) is force-picked,
    # and the line is written from that pick, with b:1's call in flight
    assert lines[0] == "p2c - conn: a:1, load: 1, reqs: 4; conn: b:1, load: 2, reqs: 1"
    caplog.clear()
    clock.now = 119.0
    picker.pick(PickInfo()).done(Outcome(OK, 0.0))
    assert caplog.records == []
    clock.now = 120.0
    picker.pick(PickInfo()).done(Outcome(OK, 0.0))
    # t=119: b:1 force-picked (last picked at 60); t=120: a:1 (b:1 picked 1 s ago, not more)
    assert [r.getMessage() for r in caplog.records] == [
        "p2c - conn: a:1, load: 2, reqs: 1; conn: b:1, load: 1, reqs: 1"
    ]
