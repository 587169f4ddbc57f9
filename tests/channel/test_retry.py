"""client/retry.py and client/retry_throttle.py units: retry decisions, backoff with an injected rng, the token
bucket, replay of streamed requests, re-picks."""

from __future__ import annotations

import random
import threading

import grpc
import pytest

from waypost.balancer.base import Outcome, PickResult
from waypost.client.replay import Replay
from waypost.client.retry import PREVIOUS_ATTEMPTS, RetryState, avoid_tried, backoff_delay, never_sent
from waypost.client.retry_throttle import RetryThrottle
from waypost.client.subconn import SubConn
from waypost.service_config import RetryPolicy, RetryThrottling, ServiceConfig, parse_service_config
from waypost.types import CONNECTING, IDLE, READY, TRANSIENT_FAILURE, Backend

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


def _sc(address: str, state: int = READY, *, failing: bool = False) -> SubConn:
    sc = SubConn(Backend(address), None, health=False)
    sc.state = state
    sc.failing = failing
    return sc


def test_avoid_tried_moves_to_an_untried_backend_and_releases_the_discarded_pick():
    released: list[Outcome] = []
    a, b, c = _sc("a:1"), _sc("b:1"), _sc("c:1")
    res_a = PickResult(a.backend, released.append)
    got = avoid_tried((res_a, a), {"a:1"}, [a, b, c], [a, b, c], lambda: (PickResult(a.backend, released.append), a))
    assert got is not None and got[1] is b  # re-pick returned a again -> first untried in order
    assert [o.code for o in released] == [grpc.StatusCode.CANCELLED] * 2
    # an untried pick is kept as is
    res_c = PickResult(c.backend)
    assert avoid_tried((res_c, c), {"a:1"}, [a, b, c], [a, b, c], lambda: None) == (res_c, c)
    # everything tried: reuse
    got = avoid_tried((res_c, c), {"a:1", "b:1", "c:1"}, [a, b, c], [a, b, c], lambda: None)
    assert got is not None and got[1] is c


@pytest.mark.parametrize("state", [IDLE, CONNECTING])
def test_avoid_tried_waits_for_an_untried_backend_still_connecting(state):
    released: list[Outcome] = []
    x, y, g = _sc("x:1"), _sc("y:1"), _sc("g:1", state)
    got = avoid_tried((PickResult(x.backend, released.append), x), {"x:1", "y:1"}, [x, y], [x, y, g], lambda: None)
    assert got is None  # wait for g, the discarded pick released once
    assert [o.code for o in released] == [grpc.StatusCode.CANCELLED]


def test_avoid_tried_waits_for_a_first_health_answer():
    x, g = _sc("x:1"), SubConn(Backend("g:1"), None, health=True)
    g.state = READY  # connected, health unknown yet: still coming
    assert avoid_tried((PickResult(x.backend), x), {"x:1"}, [x], [x, g], lambda: None) is None


def test_avoid_tried_never_waits_for_a_failing_or_removed_or_tried_backend():
    x, y = _sc("x:1"), _sc("y:1", CONNECTING)  # y: tried, now reconnecting
    dead = _sc("d:1", TRANSIENT_FAILURE, failing=True)
    backoff = _sc("b:1", CONNECTING, failing=True)  # reconnecting after a failure: sticky TRANSIENT_FAILURE
    gone = _sc("r:1", CONNECTING)
    gone.removed = True
    res = PickResult(x.backend)
    got = avoid_tried((res, x), {"x:1", "y:1"}, [x], [x, y, dead, backoff, gone], lambda: None)
    assert got == (res, x)  # nothing worth waiting for: reuse


# ---------------------------------------------------------------------------------------------
# backoff


def make_policy(initial=0.1, maximum=1.0, multiplier=2.0) -> RetryPolicy:
    return RetryPolicy(4, initial, maximum, multiplier, frozenset({grpc.StatusCode.UNAVAILABLE}))


def test_backoff_caps_follow_grpc_formula():
    p = make_policy(initial=0.1, maximum=1.0, multiplier=2.0)
    caps = [backoff_delay(p, n, FixedRng()) for n in range(1, 8)]
    assert caps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    # a huge attempt number or multiplier stays at the cap (no OverflowError)
    assert backoff_delay(p, 10_000, FixedRng()) == 1.0
    assert backoff_delay(make_policy(multiplier=1e300), 50, FixedRng()) == 1.0
    # a multiplier below 1 shrinks the cap
    assert backoff_delay(make_policy(initial=0.8, multiplier=0.5), 3, FixedRng()) == pytest.approx(0.2)


def test_backoff_is_jittered_within_bounds_with_a_seeded_rng():
    p = make_policy(initial=0.1, maximum=1.0, multiplier=2.0)
    rng = random.Random(7)
    for attempt in range(1, 9):
        cap = min(0.1 * 2 ** (attempt - 1), 1.0)
        samples = [backoff_delay(p, attempt, rng) for _ in range(200)]
        assert all(0.0 <= s <= cap for s in samples)
        # jitter spreads over the range rather than sitting at one value
        assert min(samples) < cap * 0.1 and max(samples) > cap * 0.9
    # deterministic for a given seed
    a = [backoff_delay(p, 3, random.Random(42)) for _ in range(3)]
    assert a == [random.Random(42).uniform(0.0, 0.4)] * 3


def test_backoff_attempt_starts_at_one():
    with pytest.raises(ValueError):
        backoff_delay(make_policy(), 0, random.Random(1))


# ---------------------------------------------------------------------------------------------
# retry throttling


def test_throttle_arithmetic_matches_grpc():
    t = RetryThrottle(RetryThrottling(max_tokens=10, token_ratio=0.1))
    assert t.tokens == 10 and t.allows_retry()
    # failures take one token each; retries stop once tokens <= max/2
    results = [t.record_failure() for _ in range(6)]
    assert results == [True, True, True, True, False, False]
    assert t.tokens == 4
    assert not t.allows_retry()
    # ten successes give back exactly one token (no float drift)
    for _ in range(10):
        t.record_success()
    assert t.tokens == 5 and not t.allows_retry()  # 5 is not > 5
    t.record_success()
    assert t.tokens == 5.1 and t.allows_retry()
    # never above max, never below zero
    for _ in range(1000):
        t.record_success()
    assert t.tokens == 10
    for _ in range(50):
        t.record_failure()
    assert t.tokens == 0


def test_throttle_fractional_max_tokens():
    t = RetryThrottle(RetryThrottling(max_tokens=2.5, token_ratio=0.5))
    assert t.record_failure() is True  # 1.5 > 1.25
    assert t.record_failure() is False  # 0.5
    t.record_success()
    assert t.tokens == 1.0 and not t.allows_retry()
    t.record_success()
    assert t.tokens == 1.5 and t.allows_retry()


def test_throttle_is_thread_safe():
    t = RetryThrottle(RetryThrottling(max_tokens=1000, token_ratio=1))
    for _ in range(500):
        t.record_failure()  # 500 tokens left

    def work() -> None:
        for _ in range(1000):
            t.record_failure()
            t.record_success()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    # every failure is matched by a success of the same size: the count is back where it was
    assert t.tokens == 500


def test_each_channel_gets_a_fresh_throttle_from_the_service_config():
    cfg = parse_service_config({"retryThrottling": {"maxTokens": 3, "tokenRatio": 0.5}})
    first, second = RetryThrottle.for_config(cfg.retry_throttling), RetryThrottle.for_config(cfg.retry_throttling)
    assert first is not None and second is not None and first is not second
    first.record_failure()
    assert first.tokens == 2 and second.tokens == 3
    assert RetryThrottle.for_config(ServiceConfig().retry_throttling) is None
