"""Failure-aware picking (balancer/failure.py): the per-backend state, then each load-aware policy in a small
discrete-event simulation on a fake clock with a seeded rng (shares and counts, no wall time)."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer import failure
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.failure import PUSHBACK_STOP, BackendFailures, Verdict, pushback_of
from waypost.balancer.policies import get_policy

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CANCELLED = grpc.StatusCode.CANCELLED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
POLICIES = ["peak_ewma", "least_request", "prequal"]


# ---- the per-backend state ---------------------------------------------------------------------------


def test_pushback_is_parsed_as_gRFC_A6_says():
    assert pushback_of(None) is None
    assert pushback_of([("other", "1")]) is None
    assert pushback_of([("grpc-retry-pushback-ms", "250")]) == 0.25
    assert pushback_of([("grpc-retry-pushback-ms", b"0")]) == 0.0
    assert pushback_of([("grpc-retry-pushback-ms", "-1")]) == PUSHBACK_STOP
    assert pushback_of([("grpc-retry-pushback-ms", "soon")]) == PUSHBACK_STOP


def test_the_caller_s_ends_are_neutral_and_the_backend_s_are_not():
    f = BackendFailures()
    assert f.verdict(Outcome(CANCELLED, 5.0)) is Verdict.NEUTRAL
    assert f.verdict(Outcome(DEADLINE, 0.05)) is Verdict.FAILURE  # no usual latency known: the backend's
    assert f.verdict(Outcome(grpc.StatusCode.NOT_FOUND, 0.01)) is Verdict.REJECTED  # the request's fault
    assert f.verdict(Outcome(OK, 0.01)) is Verdict.ANSWER
    f.picked(0.0)
    f.ended(Outcome(OK, 0.1), 0.1, 0)
    assert f.verdict(Outcome(DEADLINE, 0.05)) is Verdict.NEUTRAL  # shorter than its usual 100 ms
    assert f.verdict(Outcome(DEADLINE, 0.5)) is Verdict.FAILURE
    assert f.verdict(Outcome(UNAVAILABLE, 0.001)) is Verdict.FAILURE


def test_a_penalty_grows_with_failures_in_a_row_fades_and_a_fresh_answer_clears_it():
    f = BackendFailures()
    f.ended(Outcome(UNAVAILABLE, 0.001), 10.0, 0)
    assert f.penalty(10.0) == failure.FAILURE_WEIGHT
    f.ended(Outcome(UNAVAILABLE, 0.5), 10.0, 0)  # sent before the first failure came back: the same burst
    assert f.penalty(10.0) == 2 * failure.FAILURE_WEIGHT and f.streak == 1
    f.ended(Outcome(UNAVAILABLE, 0.0), 10.0, 0)  # sent after it: the second in a row weighs twice the first
    assert f.penalty(10.0) == 4 * failure.FAILURE_WEIGHT and f.streak == 2
    assert f.penalty(10.0 + failure.FAILURE_MEMORY) == pytest.approx(4 * failure.FAILURE_WEIGHT / math.e)
    f.ended(Outcome(OK, 5.0), 12.0, 0)  # sent at 7.0, before the failures: says nothing about now
    assert f.penalty(12.0) > 0.0
    f.ended(Outcome(OK, 0.1), 12.0, 0)  # sent at 11.9, after them: the backend works
    assert f.penalty(12.0) == 0.0 and f.streak == 0
    assert not f.troubled(12.0, 0.1)


def test_request_errors_weigh_a_tenth_of_a_failure_and_a_success_clears_them():
    f = BackendFailures()
    for _ in range(10):
        f.ended(Outcome(grpc.StatusCode.INVALID_ARGUMENT, 0.02), 10.0, 0)
    assert f.penalty(10.0) == pytest.approx(failure.FAILURE_WEIGHT)
    assert f.streak == 0
    f.ended(Outcome(OK, 0.1), 11.0, 0)
    assert f.penalty(11.0) == 0.0


@pytest.mark.parametrize("name", POLICIES)
def test_a_backend_rejecting_every_call_fast_does_not_draw_the_calls(name):
    # a bad deploy answers INVALID_ARGUMENT in 20 ms where the others work for 100 ms: not a failure of the
    # backend by its code, but it must not look like the fastest backend either
    sim = Sim(name, {"good": healthy(0.1), "bad": failing_between(110.0, 130.0, grpc.StatusCode.INVALID_ARGUMENT,
                                                                  0.02, 0.1)})
    sim.run(10.0)
    during = sim.run(20.0)
    assert during["bad"] < 0.05 * sum(during.values()), during  # round robin: 50 %


def test_silence_counts_from_the_second_call_since_the_last_answer():
    f = BackendFailures()
    f.picked(1.0)
    assert f.silence(5.0) == 0.0  # one call (maybe a long stream): no silence
    f.picked(2.0)
    assert f.silence(5.0) == 3.0
    assert f.troubled(5.0, 1.0) and not f.troubled(5.0, 2.0)
    f.picked(3.0)
    f.ended(Outcome(CANCELLED, 0.1), 5.0, 2)  # the caller's end is not an answer: still two outstanding
    assert f.silence(6.0) == 4.0
    f.ended(Outcome(CANCELLED, 0.1), 6.0, 1)  # one left (it may be a stream): no silence
    assert f.silence(7.0) == 0.0
    f.picked(7.0)
    f.picked(7.5)
    f.ended(Outcome(OK, 0.1), 8.0, 1)
    assert f.silence(9.0) == 0.0


def test_a_pushback_is_remembered_for_its_duration_only():
    f = BackendFailures()
    f.ended(Outcome(UNAVAILABLE, 0.001, pushback=2.0), 10.0, 0)
    assert f.pushed_back(11.9) and not f.pushed_back(12.0)
    f.ended(Outcome(UNAVAILABLE, 0.001, pushback=PUSHBACK_STOP), 13.0, 0)  # "do not retry" is no load signal
    assert not f.pushed_back(13.0)


# ---- the policies, in a discrete-event simulation ---------------------------------------------------

#: what a backend does with a call sent at time t: (status, latency); None: never answers (a black hole)
Behaviour = Callable[[float], "tuple[grpc.StatusCode, float] | None"]


def healthy(latency: float) -> Behaviour:
    return lambda t: (OK, latency)


class Sim:
    """Calls sent every ``interval`` seconds through ``policy``'s picker to backends named by address; each call
    ends as its backend's behaviour says (a black hole's calls end with DEADLINE_EXCEEDED at ``deadline``)."""

    def __init__(self, name: str, behaviours: dict[str, Behaviour], seed: int = 3, deadline: float = 5.0) -> None:
        self.clock = FakeClock(100.0)
        self.policy = get_policy(name)({}, clock=self.clock, rng=random.Random(seed))
        if name == "prequal":  # no load reports here (no prober): prequal decides on peak_ewma's statistics
            for a in behaviours:
                self.policy.on_probe_failed(a, True)
        self.picker = self.policy.build(bs(*behaviours))
        self.behaviours = behaviours
        self.deadline = deadline
        self.ends: list[tuple[float, int, object, Outcome]] = []
        self._n = itertools.count()

    def run(self, seconds: float, interval: float = 0.01) -> Counter[str]:
        """Send for ``seconds`` of clock time; the backends picked, counted."""
        picks: Counter[str] = Counter()
        stop = self.clock.now + seconds
        while self.clock.now < stop:
            self._end_until(self.clock.now)
            res = self.picker.pick(PickInfo())
            addr = res.backend.address
            picks[addr] += 1
            got = self.behaviours[addr](self.clock.now)
            if got is None:
                end, outcome = self.clock.now + self.deadline, Outcome(DEADLINE, self.deadline)
            else:
                end, outcome = self.clock.now + got[1], Outcome(got[0], got[1])
            heapq.heappush(self.ends, (end, next(self._n), res.done, outcome))
            self.clock.now += interval
        return picks

    def _end_until(self, now: float) -> None:
        while self.ends and self.ends[0][0] <= now:
            end, _, done, outcome = heapq.heappop(self.ends)
            saved, self.clock.now = self.clock.now, end
            done(outcome)  # type: ignore[operator]
            self.clock.now = saved


def failing_between(start: float, stop: float, code: grpc.StatusCode, fail_latency: float,
                    latency: float) -> Behaviour:
    return lambda t: (code, fail_latency) if start <= t < stop else (OK, latency)


@pytest.mark.parametrize("name", POLICIES)
def test_a_backend_failing_fast_gets_far_less_than_its_share_and_regains_it_after_recovering(name):
    sim = Sim(name, {"good": healthy(0.1), "bad": failing_between(110.0, 130.0, UNAVAILABLE, 0.001, 0.1)})
    sim.run(10.0)  # warm: both answer
    during = sim.run(20.0)  # bad fails every call in 1 ms, 100 calls a second for 20 s
    assert during["bad"] < 0.05 * sum(during.values()), during  # round robin: 50 %; before this module: ~97 %
    sim.run(10.0)  # it recovered at 130 s: its next calls succeed and clear its penalty
    after = sim.run(10.0)
    assert after["bad"] > 0.3 * sum(after.values()), after


@pytest.mark.parametrize("name", POLICIES)
def test_a_backend_failing_as_slowly_as_the_other_succeeds_loses_its_traffic(name):
    sim = Sim(name, {"good": healthy(0.1), "bad": failing_between(110.0, 140.0, UNAVAILABLE, 0.1, 0.1)})
    sim.run(10.0)
    during = sim.run(30.0)
    assert during["bad"] < 0.05 * sum(during.values()), during


@pytest.mark.parametrize("name", POLICIES)
def test_a_black_hole_loses_its_traffic_within_a_few_call_latencies(name):
    sim = Sim(name, {"good": healthy(0.1), "hole": lambda t: None if t >= 110.0 else (OK, 0.1)})
    sim.run(10.0)
    first = sim.run(1.0)  # ten call latencies after it went dark
    rest = sim.run(9.0)
    # calls at 100 a second: half of them (50 in the first second, 450 after) would go into the hole without
    # silence counting as latency (the estimate decays while its calls are outstanding)
    assert first["hole"] < 15, first
    assert rest["hole"] < 10, rest


@pytest.mark.parametrize("name", POLICIES)
def test_a_deadline_shorter_than_the_usual_latency_does_not_drive_traffic_away(name):
    # the caller's deadline ends b's calls after 10 ms, below b's usual 100 ms: not b's failure (before, each
    # DEADLINE_EXCEEDED counted as a slow failure and b lost its traffic)
    sim = Sim(name, {"a": healthy(0.1), "b": healthy(0.1)})
    sim.run(5.0)
    sim.behaviours["b"] = lambda t: (DEADLINE, 0.01)
    picks = sim.run(10.0)
    assert picks["b"] > 0.3 * sum(picks.values()), picks


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("ending", [Outcome(CANCELLED, 0.001), Outcome(CANCELLED, 3.0), Outcome(DEADLINE, 0.01)])
def test_the_caller_s_ends_leave_no_sample_and_no_penalty(name, ending):
    # a cancellation after 1 ms must not make b look fast, one after 3 s (a hedge's loser, a stream the caller
    # closed) must not make it look slow, and neither is a failure
    sim = Sim(name, {"a": healthy(0.1), "b": healthy(0.1)})
    sim.run(5.0)
    sim.run(1.0, interval=10.0)  # every call ended
    peak = sim.policy.fallback if name == "prequal" else sim.policy
    before = peak.snapshot() if name != "least_request" else None
    res = sim.picker.pick(PickInfo())
    res.done(ending)
    stats = sim.policy._stats if name != "prequal" else sim.policy.fallback._stats
    assert stats.get(res.backend.address).failures.penalty(sim.clock.now) == 0.0
    if before is not None:
        assert peak.snapshot() == before


@pytest.mark.parametrize("name", POLICIES)
def test_a_pushed_back_backend_gets_no_call_for_that_long_then_its_share(name):
    sim = Sim(name, {"a": healthy(0.1), "b": healthy(0.1)})
    sim.run(5.0)
    res = sim.picker.pick(PickInfo())
    other = sim.picker.pick(PickInfo()) if res.backend.address == "a" else res
    while other.backend.address != "b":
        other.done(Outcome(OK, 0.1))
        other = sim.picker.pick(PickInfo())
    if res is not other:
        res.done(Outcome(OK, 0.1))
    other.done(Outcome(grpc.StatusCode.RESOURCE_EXHAUSTED, 0.001, pushback=3.0))
    held = sim.run(3.0)
    assert held["b"] == 0, held
    sim.run(10.0)  # its penalty (a failure) fades
    after = sim.run(5.0)
    assert after["b"] > 0.3 * sum(after.values()), after


@pytest.mark.parametrize("name", POLICIES)
def test_a_long_outage_costs_a_trial_call_now_and_then_and_a_recovery_is_seen_within_seconds(name):
    # 12 calls a second: the others' load is low, so only a trial brings the failing backend a call
    sim = Sim(name, {"good": healthy(0.03), "bad": failing_between(101.0, 161.0, UNAVAILABLE, 0.001, 0.03)})
    sim.run(1.0, 1 / 12)
    sim.run(20.0, 1 / 12)  # failing: trials 1, 2, 4, 8, 16 s apart
    late = sim.run(40.0, 1 / 12)
    assert late["bad"] <= 40 / failure.MAX_TRIAL_INTERVAL + 1, late
    sim.run(failure.MAX_TRIAL_INTERVAL, 1 / 12)  # recovered at 161 s: its next trial succeeds
    after = sim.run(10.0, 1 / 12)
    assert after["bad"] > 0.3 * sum(after.values()), after
