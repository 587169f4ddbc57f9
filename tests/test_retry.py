"""retry.py units: retry decisions, backoff with an injected rng, replay of streamed requests, re-picks."""

from __future__ import annotations

import random
import threading

import grpc

from waypost.balancer.base import Outcome, PickResult
from waypost.balancer.service_config import RetryPolicy, RetryThrottle, RetryThrottling
from waypost.retry import PREVIOUS_ATTEMPTS, Replay, RetryState, avoid_tried, never_sent
from waypost.types import Backend

U = grpc.StatusCode.UNAVAILABLE
POLICY = RetryPolicy(max_attempts=3, initial_backoff=0.1, max_backoff=1.0, backoff_multiplier=2.0,
                     retryable_status_codes=frozenset({U}))


class FixedRng:
    """uniform(a, b) -> b: makes the backoff upper bound observable."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_retryable_codes_attempt_limit_and_backoff_growth():
    st = RetryState(POLICY, None, FixedRng(), None)
    assert st.after_failure(U, "boom") == 0.1  # attempt 1 failed: retry after up to 0.1 s
    assert st.after_failure(U, "boom") == 0.2  # attempt 2 failed: up to 0.1 * 2
    assert st.after_failure(U, "boom") is None  # attempt 3 was the last (maxAttempts 3)
    st = RetryState(POLICY, None, FixedRng(), None)
    assert st.after_failure(grpc.StatusCode.NOT_FOUND, "x") is None


def test_attempt_count_matches_max_attempts():
    st = RetryState(POLICY, None, FixedRng(), None)
    delays = []
    while (d := st.after_failure(U, "x")) is not None:
        delays.append(d)
    assert delays == [0.1, 0.2][: POLICY.max_attempts - 1]
    assert st.attempts == POLICY.max_attempts


def test_backoff_is_jittered_with_injected_rng():
    a = [RetryState(POLICY, None, random.Random(7), None).after_failure(U, "x") for _ in range(3)]
    b = [RetryState(POLICY, None, random.Random(7), None).after_failure(U, "x") for _ in range(3)]
    assert a == b and all(0 <= d <= 0.1 for d in a)


def test_deadline_stops_retries():
    import time

    st = RetryState(POLICY, None, FixedRng(), time.monotonic() + 0.05)
    assert st.after_failure(U, "x") is None  # 0.1 s backoff would pass the deadline


def test_throttle_gates_retries():
    th = RetryThrottle(RetryThrottling(max_tokens=3, token_ratio=0.5))
    st = RetryState(RetryPolicy(5, 0.001, 0.001, 1.0, frozenset({U})), th, FixedRng(), None)
    assert st.after_failure(U, "x") is not None  # tokens 2 > 1.5
    assert st.after_failure(U, "x") is None  # tokens 1 <= 1.5


def test_never_sent_failures_are_transparent_and_bounded():
    st = RetryState(None, None, FixedRng(), None)  # no policy at all
    details = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"
    assert never_sent(U, details)
    assert not never_sent(U, "Socket closed")
    assert not never_sent(grpc.StatusCode.INTERNAL, details)
    assert [st.after_failure(U, details) for _ in range(4)] == [0.0, 0.0, 0.0, None]


def test_previous_attempts_metadata():
    st = RetryState(POLICY, None, FixedRng(), None)
    assert st.metadata([("k", "v")]) == [("k", "v")]
    assert st.metadata([("k", "v")]) == (("k", "v"), (PREVIOUS_ATTEMPTS, "1"))
    assert st.metadata(None) == ((PREVIOUS_ATTEMPTS, "2"),)


def test_replay_gives_each_attempt_the_same_requests():
    rp = Replay(iter(range(5)))
    first = rp.attempt()
    assert [next(first), next(first)] == [0, 1]
    assert list(rp.attempt()) == [0, 1, 2, 3, 4]  # replays, then continues the source
    assert rp.replayable


def test_replay_past_limit_is_not_replayable():
    rp = Replay(iter(range(10)), limit=3)
    assert list(rp.attempt()) == list(range(10))
    assert not rp.replayable


def test_replay_concurrent_consumers_newest_sees_everything_older_a_prefix():
    rp = Replay(iter(range(800)))
    its = [rp.attempt(), rp.attempt()]  # the second is the newest attempt
    out: list[list[int]] = [[], []]

    def consume(i: int) -> None:
        out[i] = list(its[i])

    ts = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert out[1] == list(range(800))
    assert out[0] == list(range(len(out[0])))  # the stale attempt stops, it never skips an item


def test_replay_stale_attempt_cannot_take_an_item_past_the_limit():
    # a failed attempt's gRPC thread still inside next() after the retry started: past the buffer
    # limit the item it took would be lost to the new attempt; instead the stale attempt just ends
    rp = Replay(iter(range(6)), limit=3)
    stale = rp.attempt()
    assert [next(stale) for _ in range(3)] == [0, 1, 2]
    assert rp.replayable
    new = rp.attempt()  # the retry
    assert list(stale) == []
    assert list(new) == [0, 1, 2, 3, 4, 5]
    assert not rp.replayable


class _SC:
    def __init__(self, address: str) -> None:
        self.address = address
        self.backend = Backend(address)


def test_avoid_tried_moves_to_an_untried_backend_and_releases_the_discarded_pick():
    released: list[Outcome] = []
    a, b, c = _SC("a:1"), _SC("b:1"), _SC("c:1")
    res_a = PickResult(a.backend, released.append)
    got = avoid_tried((res_a, a), {"a:1"}, lambda: [a, b, c], lambda: (PickResult(a.backend, released.append), a))
    assert got[1] is b  # re-pick returned a again -> first untried in order
    assert [o.code for o in released] == [grpc.StatusCode.CANCELLED] * 2
    # an untried pick is kept as is
    res_c = PickResult(c.backend)
    assert avoid_tried((res_c, c), {"a:1"}, lambda: [a, b, c], lambda: None) == (res_c, c)
    # everything tried: reuse
    assert avoid_tried((res_c, c), {"a:1", "b:1", "c:1"}, lambda: [a, b, c], lambda: None)[1] is c
