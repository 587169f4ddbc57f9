"""client/hedging.py on an injected clock: when hedges are due, what stops them (attempts, throttle, extra share,
pushback), what a non-fatal or fatal status does, the adaptive delay and its quantile estimator."""

from __future__ import annotations

import grpc
import pytest

from waypost.balancer.failure import PUSHBACK_STOP, pushback_of
from waypost.client.hedging import ChannelHedging, ExtraShare, LatencyQuantile
from waypost.client.retry_throttle import RetryThrottle
from waypost.service_config import HedgingPolicy, RetryThrottling

U = grpc.StatusCode.UNAVAILABLE
NOT_FOUND = grpc.StatusCode.NOT_FOUND


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _policy(**kw: object) -> HedgingPolicy:
    base: dict[str, object] = {"max_attempts": 3, "delay": 0.5, "non_fatal_status_codes": frozenset({U}),
                               "max_extra_share": 2.0}
    base.update(kw)
    return HedgingPolicy(**base)  # type: ignore[arg-type]


def _channel(clock: Clock, throttle: RetryThrottle | None = None) -> ChannelHedging:
    return ChannelHedging(throttle, clock)


def test_hedges_every_delay_up_to_max_attempts():
    clock = Clock()
    plan = _channel(clock).for_method("/a.S/M", _policy()).plan()  # type: ignore[union-attr]
    assert plan.wait() == 0.5
    clock.now += 0.5
    assert plan.wait() == 0 and plan.admit() and plan.sent == 2
    assert plan.wait() == 0.5  # the next one a delay after this one
    clock.now += 0.5
    assert plan.wait() == 0 and plan.admit() and plan.sent == 3
    assert plan.wait() is None  # maxAttempts reached


def test_non_fatal_sends_next_at_once_and_fatal_ends_the_call():
    clock = Clock()
    plan = _channel(clock).for_method("/a.S/M", _policy()).plan()  # type: ignore[union-attr]
    assert plan.failed(U) is False and plan.wait() == 0
    assert plan.admit() and plan.wait() == 0.5  # then resumes at hedgingDelay
    assert plan.failed(NOT_FOUND) is True


def test_pushback():
    clock = Clock()
    method = _channel(clock).for_method("/a.S/M", _policy())
    assert method is not None
    plan = method.plan()
    assert plan.failed(U, 0.2) is False and plan.wait() == pytest.approx(0.2)
    plan = method.plan()
    assert plan.failed(U, -1) is False and plan.wait() is None
    assert pushback_of([("grpc-retry-pushback-ms", "250")]) == 0.25
    assert pushback_of([("grpc-retry-pushback-ms", "-5")]) == PUSHBACK_STOP
    assert pushback_of([("grpc-retry-pushback-ms", "soon")]) == PUSHBACK_STOP  # unreadable: do not retry (A6)
    assert pushback_of([("grpc-retry-pushback-ms", str(2**31))]) == PUSHBACK_STOP  # not a 32-bit integer
    assert pushback_of([("other", "1")]) is None and pushback_of(None) is None


def test_throttle_gates_hedges_and_counts_non_fatal_failures():
    clock = Clock()
    throttle = RetryThrottle(RetryThrottling(max_tokens=4, token_ratio=0.5))
    method = _channel(clock, throttle).for_method("/a.S/M", _policy())
    assert method is not None
    plan = method.plan()
    plan.failed(U)  # 3 tokens
    assert plan.admit()
    plan.failed(U)  # 2 tokens: not above the threshold 2
    assert not plan.admit() and plan.wait() is None
    assert method.plan().failed(NOT_FOUND) and throttle.tokens == 2  # a fatal status is not a failure (A6)...
    assert method.plan().failed(NOT_FOUND, -1) and throttle.tokens == 1  # ...unless its pushback says "stop"
    throttle.record_success()
    throttle.record_success()
    method.plan().succeeded()
    assert throttle.tokens == 2.5


def test_extra_share_caps_hedges_as_a_share_of_calls():
    share = ExtraShare()
    admitted = 0
    for _ in range(200):
        share.note_call(0.05)
        admitted += share.take()
    assert admitted == 10 and share.hedges == 10 and share.calls == 200  # 5 % of 200, never ahead of it
    quiet = ExtraShare()
    for _ in range(10_000):
        quiet.note_call(0.05)
    assert sum(quiet.take() for _ in range(100)) == 10  # a long quiet spell banks at most the burst


def test_extra_share_in_a_plan_stops_that_calls_hedges():
    clock = Clock()
    method = _channel(clock).for_method("/a.S/M", _policy(max_extra_share=0.5))
    assert method is not None
    first = method.plan()  # balance 0.5: no hedge yet
    assert not first.admit() and first.wait() is None
    second = method.plan()  # balance 1.0
    assert second.admit()


def test_adaptive_delay_uses_fallback_then_quantile_with_floor():
    clock = Clock()
    policy = _policy(delay_quantile=0.9, min_delay=0.02, fallback_delay=0.3)
    method = _channel(clock).for_method("/a.S/M", policy)
    assert method is not None
    assert method.delay() == 0.3
    for i in range(100):  # latencies 0.01 .. 1.00 s
        plan = method.plan()
        clock.now += (i + 1) / 100
        plan.succeeded()
    assert 0.84 <= method.delay() <= 0.90  # p90 of what it knew when last re-sorted (every 16 samples)
    fast = _channel(clock).for_method("/a.S/M", policy)
    assert fast is not None
    for _ in range(100):
        plan = fast.plan()
        clock.now += 0.001
        plan.succeeded()
    assert fast.delay() == 0.02  # the floor


def test_latency_quantile_window_follows_recent_latency():
    q = LatencyQuantile(0.95, window=100, min_samples=10, every=1)
    assert q.value() is None
    for _ in range(100):
        q.add(0.01)
    assert q.value() == 0.01
    for _ in range(100):
        q.add(0.05)
    assert q.value() == 0.05  # the old samples left the window


def test_methods_share_the_channel_budget_but_not_latencies():
    clock = Clock()
    ch = _channel(clock)
    a = ch.for_method("/a.S/A", _policy(delay_quantile=0.5))
    b = ch.for_method("/a.S/B", _policy(delay_quantile=0.5))
    assert a is not None and b is not None
    assert a.share is b.share and a.latencies is not b.latencies
    assert ch.for_method("/a.S/A", _policy(delay_quantile=0.5)).latencies is a.latencies  # type: ignore[union-attr]
    assert ch.for_method("/a.S/C", None) is None
