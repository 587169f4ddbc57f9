"""Retry and failover across backends: the retry state of one call and where its next attempt goes.

gRPC's retry semantics (gRFC A6), done by the balanced channel so that each attempt is a fresh pick:
- only codes in ``retryableStatusCodes``, at most ``maxAttempts`` attempts, jittered exponential backoff;
- a server's ``grpc-retry-pushback-ms`` trailer: a non-negative value is the delay instead of the backoff, a
  negative or malformed one ends the retries;
- only while no response message has been received (streams: before the first message);
- the deadline covers all attempts; ``grpc-previous-rpc-attempts`` is sent on retries;
- ``retryThrottling``: a token bucket per channel gates retries;
- the next attempt goes to a backend not tried yet when there is one, waiting (within the deadline) for one
  still connecting when every READY backend was tried (``avoid_tried``);
- "transparent" retries: an attempt that failed before reaching any server (the connection was already
  gone) is re-picked at once, without counting as an attempt, even without a retry policy.

The request replay of client-streaming retries is in ``replay`` (sync) and ``aio_replay``; the sync retrying
response stream in ``retrying_stream``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import grpc

from ..balancer.base import Outcome, PickResult
from ..balancer.failure import PUSHBACK_STOP
from ..service_config import RetryPolicy
from .retry_throttle import RetryThrottle
from .subconn import SubConn

__all__ = ["MAX_TRANSPARENT", "PREVIOUS_ATTEMPTS", "RetryState", "Rng", "avoid_tried", "backoff_delay", "never_sent"]

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

#: At most this many transparent re-picks per call (a connection-level failure seen on pick after pick).
MAX_TRANSPARENT = 3

_NOT_SENT_MARKERS = ("failed to connect to all addresses", "connection refused", "connect failed")

_CANCELLED_PICK = Outcome(grpc.StatusCode.CANCELLED, 0.0)


class Rng(Protocol):
    """The part of ``random.Random`` that backoff needs."""

    def uniform(self, a: float, b: float) -> float: ...


def backoff_delay(policy: RetryPolicy, attempt: int, rng: Rng) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = the first retry) under ``policy``.

    gRPC's jittered exponential backoff: uniform in
    ``[0, min(initial_backoff * backoff_multiplier ** (attempt - 1), max_backoff)]``.
    """
    if attempt < 1:
        raise ValueError(f"retry attempt numbers start at 1, got {attempt}")
    try:
        grown = policy.initial_backoff * policy.backoff_multiplier ** (attempt - 1)
    except OverflowError:  # a huge multiplier ** attempt: the cap applies anyway
        grown = math.inf
    return rng.uniform(0.0, min(grown, policy.max_backoff))


def never_sent(code: grpc.StatusCode, details: str | None) -> bool:
    """True when an UNAVAILABLE attempt certainly never reached a server (safe to re-pick at once)."""
    if code is not grpc.StatusCode.UNAVAILABLE or not details:
        return False
    d = details.lower()
    return any(m in d for m in _NOT_SENT_MARKERS)


class RetryState:
    """Bookkeeping of one call's attempts: made when a call may retry.

    ``first``: the backend address of the call's first attempt, for a state made only once that attempt
    failed (a call whose first attempt succeeds need not make one): that attempt counts as sent and tried.
    """

    __slots__ = ("attempts", "deadline", "policy", "rng", "started", "throttle", "transparent", "tried")

    def __init__(
        self,
        policy: RetryPolicy | None,
        throttle: RetryThrottle | None,
        rng: Rng,
        deadline: float | None,
        first: str | None = None,
    ) -> None:
        self.policy = policy
        self.throttle = throttle
        self.rng = rng
        self.deadline = deadline
        self.attempts = 0  # attempts started, transparent ones excluded
        self.transparent = 0
        if first is None:
            self.started = 0  # attempts sent so far, transparent ones included
            self.tried: set[str] = set()
        else:
            self.started = 1
            self.tried = {first}

    def metadata(self, metadata: Sequence[tuple[str, Any]] | None) -> Sequence[tuple[str, Any]] | None:
        """Request metadata for the next attempt (adds grpc-previous-rpc-attempts on retries); counts it."""
        n = self.started
        self.started = n + 1
        if n == 0:
            return metadata
        return (*(metadata or ()), (PREVIOUS_ATTEMPTS, str(n)))

    def may_retry(self, code: grpc.StatusCode, details: str | None) -> bool:
        """Whether a failure with this status could be retried (read-only: no throttle, backoff or deadline)."""
        if never_sent(code, details) and self.transparent < MAX_TRANSPARENT:
            return True
        policy = self.policy
        return policy is not None and code in policy.retryable_status_codes and self.attempts + 1 < policy.max_attempts

    def after_failure(self, code: grpc.StatusCode, details: str | None, pushback: float | None = None
                      ) -> float | None:
        """An attempt failed: seconds to wait before the next one, or None to give up (raise).

        ``pushback``: the attempt's ``grpc-retry-pushback-ms`` (``failure.pushback_of`` of its trailers); gRFC A6: a
        non-negative value replaces the backoff, a negative or malformed one (``PUSHBACK_STOP``) stops retrying."""
        if never_sent(code, details) and self.transparent < MAX_TRANSPARENT:
            self.transparent += 1
            return 0.0
        policy = self.policy
        if policy is None or code not in policy.retryable_status_codes:
            if self.throttle is not None and policy is not None:
                self.throttle.record_success()  # a non-retryable end counts as success for the bucket (gRPC)
            return None
        allowed = self.throttle.record_failure() if self.throttle is not None else True
        self.attempts += 1
        if not allowed or self.attempts >= policy.max_attempts or pushback == PUSHBACK_STOP:
            return None
        delay = backoff_delay(policy, self.attempts, self.rng) if pushback is None else pushback
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            return None
        return delay


def avoid_tried(
    picked: tuple[PickResult, SubConn],
    tried: Collection[str],
    ready: Iterable[SubConn],
    backends: Iterable[SubConn],
    repick: Callable[[], tuple[PickResult, SubConn] | None],
) -> tuple[PickResult, SubConn] | None:
    """Where a retry goes when the policy picked ``picked``: the one rule that moves attempts across backends.

    ``tried``: addresses this call's earlier attempts went to; ``ready``: the subconns the picker may return;
    ``backends``: every subconn of the channel (their ``connecting`` is read live). In order:

    - the pick is untried: keep it;
    - another READY backend is untried: re-pick once, then take the first untried READY one;
    - none, but an untried backend is still connecting (IDLE, CONNECTING, or READY with its first health
      answer pending; never one in TRANSIENT_FAILURE): return None, the caller waits for the next picker
      (bounded by the deadline) and calls again;
    - otherwise every backend worth trying was tried: reuse the pick.

    A discarded pick is released with a CANCELLED outcome (its ``done`` must run exactly once).
    """
    res, sc = picked
    if sc.address not in tried:
        return picked
    untried = [c for c in ready if c.address not in tried]
    if not untried:
        if any(c.connecting for c in backends if c.address not in tried):
            res.done(_CANCELLED_PICK)
            return None
        return picked
    res.done(_CANCELLED_PICK)
    again = repick()
    if again is not None and again[1].address not in tried:
        return again
    if again is not None:
        again[0].done(_CANCELLED_PICK)
    sc = untried[0]
    return PickResult(sc.backend), sc
