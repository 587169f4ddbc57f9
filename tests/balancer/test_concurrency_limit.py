"""The adaptive concurrency limit (balancer/concurrency_limit.py): its AIMD arithmetic, what counts as a failure, its
config, and peak_ewma's picks under it (a backend at its limit is skipped, every backend at its limit refuses the
call for now, a freed slot wakes the waiting calls). Clock injected; no timing."""

from __future__ import annotations

import random

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.concurrency_limit import AtLimit, BackendLimit, LimitSettings, parse_limit
from waypost.balancer.failure import Verdict
from waypost.balancer.peak_ewma import PeakEwmaPolicy
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig, NoBackendAvailable

OK = grpc.StatusCode.OK
INTERNAL = grpc.StatusCode.INTERNAL
CANCELLED = grpc.StatusCode.CANCELLED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
INVALID = grpc.StatusCode.INVALID_ARGUMENT


# ---- the limit's arithmetic ---------------------------------------------------------------------------------

def test_a_failure_multiplies_the_limit_by_the_backoff_ratio_rounded_down_floored_at_min():
    lim = BackendLimit(LimitSettings(initial=20, min=3, max=100, backoff=0.9))
    seen = []
    for _ in range(8):
        lim.release(Verdict.FAILURE, lim.acquire())
        seen.append(lim.limit)
    assert seen == [18, 16, 14, 12, 10, 9, 8, 7]
    for _ in range(20):
        lim.release(Verdict.FAILURE, lim.acquire())
    assert lim.limit == 3
    assert lim.inflight == 0


def test_an_answer_that_used_most_of_the_limit_raises_it_by_one_up_to_max():
    lim = BackendLimit(LimitSettings(initial=10, min=1, max=12, backoff=0.9))
    sent = [lim.acquire() for _ in range(9)]  # 9 in flight: floor(10 * 0.9) = 9, most of the limit
    assert sent == list(range(1, 10))
    lim.release(Verdict.ANSWER, sent[-1])
    assert lim.limit == 11
    lim.release(Verdict.REJECTED, sent[-2])  # 8 of floor(11 * 0.9) = 9: not most of it
    assert lim.limit == 11
    for _ in range(5):
        lim.release(Verdict.ANSWER, 12)
    assert lim.limit == 12  # max


def test_a_request_error_is_an_answer_and_the_callers_own_end_changes_nothing():
    lim = BackendLimit(LimitSettings(initial=2, min=1, max=10, backoff=0.9))
    lim.acquire()
    lim.release(Verdict.REJECTED, 2)
    assert lim.limit == 3
    lim.acquire()
    lim.release(Verdict.NEUTRAL, 3)
    assert (lim.limit, lim.inflight) == (3, 0)


def test_full_admits_the_whole_calls_of_the_limit_and_always_one():
    lim = BackendLimit(LimitSettings(initial=2, min=1, max=10, backoff=0.5))
    lim.acquire()
    assert not lim.full()
    lim.acquire()
    assert lim.full()
    lim.limit = 2.9
    assert lim.full()  # 2 in flight, 2.9 admits 2
    lim.release(Verdict.FAILURE, 2)  # 2.9 * 0.5 -> 1
    assert lim.limit == 1 and lim.full()
    assert lim.release(Verdict.FAILURE, 1)  # freed: the last call ended, one may go again
    assert not lim.full()


def test_release_says_freed_only_when_a_full_backend_can_take_a_call_again():
    lim = BackendLimit(LimitSettings(initial=2, min=1, max=10, backoff=0.5))
    a, b = lim.acquire(), lim.acquire()
    assert lim.full()
    assert not lim.release(Verdict.FAILURE, a)  # 2 -> 1 with 1 still in flight: still full, nobody to wake
    assert lim.release(Verdict.ANSWER, b)  # full before, not after (and the limit back to 2)
    assert lim.limit == 2
    c = lim.acquire()
    assert not lim.release(Verdict.ANSWER, c)  # it was not full: nobody was waiting for it


# ---- config ---------------------------------------------------------------------------------------------------

def test_the_field_parses_with_defaults_and_rejects_what_is_wrong():
    cfg = {"concurrencyLimit": {}}
    parse_limit(cfg, "lb.peak_ewma")
    assert cfg["concurrencyLimit"] == LimitSettings(20, 1, 1000, 0.9)
    cfg = {"concurrencyLimit": {"initial": 5, "min": 2, "max": 9.0, "backoffRatio": 0.5}}
    parse_limit(cfg, "lb.peak_ewma")
    assert cfg["concurrencyLimit"] == LimitSettings(5, 2, 9, 0.5)
    bad = [
        ({"intial": 3}, "lb.peak_ewma.concurrencyLimit.intial: unknown field for concurrencyLimit (did you mean"),
        ({"min": 0}, "lb.peak_ewma.concurrencyLimit.min: expected a whole number of calls from 1"),
        ({"max": True}, "lb.peak_ewma.concurrencyLimit.max: expected a whole number"),
        ({"initial": 30, "max": 10}, "lb.peak_ewma.concurrencyLimit: expected min <= initial <= max"),
        ({"backoffRatio": 1}, "lb.peak_ewma.concurrencyLimit.backoffRatio: expected a number between 0 and 1"),
    ]
    for raw, message in bad:
        with pytest.raises(InvalidServiceConfig) as e:
            parse_limit({"concurrencyLimit": raw}, "lb.peak_ewma")
        assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(InvalidServiceConfig, match=r"lb.peak_ewma.concurrencyLimit: expected a JSON object"):
        parse_limit({"concurrencyLimit": 20}, "lb.peak_ewma")


def test_peak_ewma_takes_the_field_and_names_a_misspelt_one():
    cfg = PeakEwmaPolicy.parse_config({"concurrencyLimit": {"max": 50}}, "loadBalancingConfig[0].peak_ewma")
    assert cfg["concurrencyLimit"].max == 50
    with pytest.raises(InvalidServiceConfig, match=r"peak_ewma\.concurrencyLimits: unknown field for peak_ewma"):
        PeakEwmaPolicy.parse_config({"concurrencyLimits": {}}, "loadBalancingConfig[0].peak_ewma")


# ---- peak_ewma's picks under the limit ------------------------------------------------------------------------

def _policy(initial: int = 2, **kw: float) -> tuple[PeakEwmaPolicy, FakeClock, list[int]]:
    clock = FakeClock(100.0)
    pol = PeakEwmaPolicy({"concurrencyLimit": {"initial": initial, "min": 1, "max": 100, **kw}}, clock=clock,
                         rng=random.Random(7))
    woken: list[int] = []
    pol.attach_waker(lambda: woken.append(1))
    return pol, clock, woken


def test_a_backend_at_its_limit_gets_no_more_calls_and_all_at_the_limit_refuse_for_now():
    pol, _, _ = _policy(initial=2)
    picker = pol.build(bs("a", "b", "c"))
    picks = [picker.pick(PickInfo()) for _ in range(6)]
    counts = {a: sum(p.backend.address == a for p in picks) for a in "abc"}
    assert counts == {"a": 2, "b": 2, "c": 2}
    with pytest.raises(AtLimit) as e:
        picker.pick(PickInfo())
    assert isinstance(e.value, NoBackendAvailable)  # code that knows no limit treats it as "nothing to pick now"
    assert "every READY backend (3) is at its concurrency limit" in str(e.value)


def test_a_call_ending_at_a_full_backend_wakes_the_waiting_calls_and_frees_that_backend_only():
    pol, clock, woken = _policy(initial=2)
    picker = pol.build(bs("a", "b"))
    picks = [picker.pick(PickInfo()) for _ in range(4)]
    clock.now += 0.01
    first_b = next(p for p in picks if p.backend.address == "b")
    first_b.done(Outcome(OK, 0.01))
    assert woken == [1]
    assert picker.pick(PickInfo()).backend.address == "b"  # a is still at its limit
    assert pol._stats.get("b").limit.limit == 3  # 2 in flight of 2 when sent: most of it, +1


def test_failures_shrink_the_limit_so_a_failing_backend_takes_fewer_calls_at_a_time():
    pol, clock, woken = _policy(initial=4)
    picker = pol.build(bs("a"))
    for _ in range(3):  # four calls out, four failures: 4 -> 3 -> 2 -> 1 -> 1
        picks = [picker.pick(PickInfo()) for _ in range(int(pol._stats.get("a").limit.limit))]
        clock.now += 0.01
        for p in picks:
            p.done(Outcome(INTERNAL, 0.01))
    assert pol._stats.get("a").limit.limit == 1
    p = picker.pick(PickInfo())
    with pytest.raises(AtLimit):
        picker.pick(PickInfo())
    woken.clear()
    p.done(Outcome(OK, 0.01))  # recovered: the one call it had was all of its limit
    assert woken == [1]
    assert pol._stats.get("a").limit.limit == 2


def test_the_callers_cancellations_and_short_deadlines_leave_the_limit_alone():
    pol, _, _ = _policy(initial=10)
    picker = pol.build(bs("a"))
    picker.pick(PickInfo()).done(Outcome(OK, 0.05))  # the usual latency: 50 ms
    lim = pol._stats.get("a").limit
    before = lim.limit
    picker.pick(PickInfo()).done(Outcome(CANCELLED, 0.2))
    picker.pick(PickInfo()).done(Outcome(DEADLINE, 0.01))  # the caller's deadline: shorter than any answer here
    assert (lim.limit, lim.inflight) == (before, 0)
    picker.pick(PickInfo()).done(Outcome(DEADLINE, 0.5))  # longer than its answers: the backend's failure
    assert lim.limit == 9


def test_without_the_field_there_is_no_limit():
    pol = PeakEwmaPolicy({}, clock=FakeClock(), rng=random.Random(1))
    picker = pol.build(bs("a"))
    for _ in range(50):
        picker.pick(PickInfo())
    assert pol.limits is None and pol._stats.get("a").limit is None


def test_a_call_waits_for_a_full_sound_backend_rather_than_go_to_a_failing_one_until_its_trial():
    pol, clock, _ = _policy(initial=2, max=2)
    picker = pol.build(bs("a", "b"))
    warm = [picker.pick(PickInfo()) for _ in range(2)]
    assert sorted(p.backend.address for p in warm) == ["a", "b"]
    clock.now += 0.01
    for p in warm:
        p.done(Outcome(OK, 0.01))  # both answer: both measured
    picks = [picker.pick(PickInfo()) for _ in range(4)]
    assert sorted(p.backend.address for p in picks) == ["a", "a", "b", "b"]
    clock.now += 0.01
    for p in picks:
        if p.backend.address == "b":
            p.done(Outcome(INTERNAL, 0.01))  # b fails (limit 2 -> 1, a failure penalty); a is full
    with pytest.raises(AtLimit):
        picker.pick(PickInfo())  # b has room, but it fails: wait for a
    clock.now += 1.0  # b's trial is due (failure.TRIAL_INTERVAL)
    assert picker.pick(PickInfo()).backend.address == "b"
    with pytest.raises(AtLimit):
        picker.pick(PickInfo())  # b at its limit of 1 now, a still full


def test_when_every_backend_fails_their_limits_pace_the_calls_sent_to_them():
    pol, clock, _ = _policy(initial=1)
    picker = pol.build(bs("a", "b"))
    for _ in range(3):
        picks = [picker.pick(PickInfo()) for _ in range(2)]
        assert sorted(p.backend.address for p in picks) == ["a", "b"]
        with pytest.raises(AtLimit):
            picker.pick(PickInfo())
        clock.now += 0.01
        for p in picks:
            p.done(Outcome(INTERNAL, 0.01))


def test_outlier_detection_passes_the_wake_up_to_a_limited_child():
    woken: list[int] = []
    raw = {"childPolicy": [{"peak_ewma": {"concurrencyLimit": {"initial": 1, "max": 1}}}]}
    cls = get_policy("outlier_detection")
    pol = cls(cls.parse_config(raw, "lb.outlier_detection"), clock=FakeClock(), rng=random.Random(3))
    pol.attach_waker(lambda: woken.append(1))
    picker = pol.build(bs("a"))
    p = picker.pick(PickInfo())
    with pytest.raises(AtLimit):
        picker.pick(PickInfo())
    p.done(Outcome(OK, 0.01))
    assert woken == [1]


def test_least_request_takes_the_limit_too():
    cls = get_policy("least_request")
    pol = cls(cls.parse_config({"concurrencyLimit": {"initial": 2, "max": 2}}, "lb.least_request"),
              clock=FakeClock(), rng=random.Random(5))
    woken: list[int] = []
    pol.attach_waker(lambda: woken.append(1))
    picker = pol.build(bs("a", "b"))
    picks = [picker.pick(PickInfo()) for _ in range(4)]
    assert sorted(p.backend.address for p in picks) == ["a", "a", "b", "b"]
    with pytest.raises(AtLimit, match="least_request: every READY backend"):
        picker.pick(PickInfo())
    picks[0].done(Outcome(OK, 0.01))
    assert woken == [1]
    assert picker.pick(PickInfo()).backend.address == picks[0].backend.address
    with pytest.raises(InvalidServiceConfig, match=r"lb.least_request.concurrencyLimit.min: expected a whole"):
        cls.parse_config({"concurrencyLimit": {"min": -1}}, "lb.least_request")
