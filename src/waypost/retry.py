"""Retry and failover across backends: per-call retry state, request replay, the retrying response stream.

gRPC's retry semantics (gRFC A6), done by the balanced channel so that each attempt is a fresh pick:
- only codes in ``retryableStatusCodes``, at most ``maxAttempts`` attempts, jittered exponential backoff;
- only while no response message has been received (streams: before the first message);
- the deadline covers all attempts; ``grpc-previous-rpc-attempts`` is sent on retries;
- ``retryThrottling``: a token bucket per channel gates retries;
- the next attempt goes to a backend not tried yet when there is one;
- "transparent" retries: an attempt that failed before reaching any server (the connection was already
  gone) is re-picked at once, without counting as an attempt, even without a retry policy.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc

from .balancer.base import Outcome, PickResult
from .balancer.service_config import RetryPolicy, RetryThrottle

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

#: At most this many transparent re-picks per call (a connection-level failure seen on pick after pick).
MAX_TRANSPARENT = 3

#: Requests of a client-streaming call kept for replay; beyond this the call is committed (no more retries).
REPLAY_LIMIT = 1024

_NOT_SENT_MARKERS = ("failed to connect to all addresses", "connection refused", "connect failed")

_CANCELLED_PICK = Outcome(grpc.StatusCode.CANCELLED, 0.0)


def never_sent(code: grpc.StatusCode, details: str | None) -> bool:
    """True when an UNAVAILABLE attempt certainly never reached a server (safe to re-pick at once)."""
    if code is not grpc.StatusCode.UNAVAILABLE or not details:
        return False
    d = details.lower()
    return any(m in d for m in _NOT_SENT_MARKERS)


class RetryState:
    """Bookkeeping of one call's attempts (one object per call that may retry)."""

    __slots__ = ("attempts", "deadline", "policy", "rng", "started", "throttle", "transparent", "tried")

    def __init__(
        self,
        policy: RetryPolicy | None,
        throttle: RetryThrottle | None,
        rng: random.Random,
        deadline: float | None,
    ) -> None:
        self.policy = policy
        self.throttle = throttle
        self.rng = rng
        self.deadline = deadline
        self.attempts = 0  # attempts started, transparent ones excluded
        self.transparent = 0
        self.started = 0  # attempts sent so far, transparent ones included
        self.tried: set[str] = set()

    def metadata(self, metadata: Sequence[tuple[str, Any]] | None) -> Sequence[tuple[str, Any]] | None:
        """Request metadata for the next attempt (adds grpc-previous-rpc-attempts on retries); counts it."""
        n = self.started
        self.started = n + 1
        if n == 0:
            return metadata
        return (*(metadata or ()), (PREVIOUS_ATTEMPTS, str(n)))

    def timeout(self) -> float | None:
        """Timeout for the next attempt: what is left of the call's deadline."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def succeeded(self) -> None:
        if self.throttle is not None:
            self.throttle.record_success()

    def after_failure(self, code: grpc.StatusCode, details: str | None) -> float | None:
        """An attempt failed: seconds to wait before the next one, or None to give up (raise)."""
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
        if not allowed or self.attempts >= policy.max_attempts:
            return None
        delay = policy.backoff(self.attempts, self.rng)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            return None
        return delay


def avoid_tried(
    picked: tuple[PickResult, Any],
    tried: set[str],
    candidates: Callable[[], Iterable[Any]],
    repick: Callable[[], tuple[PickResult, Any] | None],
) -> tuple[PickResult, Any]:
    """Move a retry to a backend not tried yet: re-pick once, then take the first untried usable one.

    A discarded pick is released with a CANCELLED outcome (its ``done`` must run exactly once).
    """
    res, sc = picked
    if sc.address not in tried:
        return res, sc
    untried = [c for c in candidates() if c.address not in tried]
    if not untried:
        return res, sc  # every usable backend was tried: reuse
    res.done(_CANCELLED_PICK)
    again = repick()
    if again is not None and again[1].address not in tried:
        return again
    if again is not None:
        again[0].done(_CANCELLED_PICK)
    sc = untried[0]
    return PickResult(sc.backend), sc


class Replay:
    """A request iterator that can be replayed by a later attempt (client-streaming retries).

    Items are recorded as attempts consume them (under a lock: gRPC consumes request iterators on
    its own thread, and a failed attempt's thread may still be inside ``next``). Past ``limit`` items
    the call cannot be retried any more (``replayable`` turns False).
    """

    def __init__(self, source: Iterable[Any], limit: int = REPLAY_LIMIT) -> None:
        self._src = iter(source)
        self._buf: list[Any] = []
        self._lock = threading.Lock()
        self._exhausted = False
        self._limit = limit
        self.replayable = True

    def attempt(self) -> Iterator[Any]:
        """A fresh iterator: the recorded items, then the rest of the source."""
        i = 0
        while True:
            with self._lock:
                if i < len(self._buf):
                    item = self._buf[i]
                elif self._exhausted:
                    return
                else:
                    try:
                        item = next(self._src)
                    except StopIteration:
                        self._exhausted = True
                        return
                    if self.replayable and len(self._buf) < self._limit:
                        self._buf.append(item)
                    else:
                        self.replayable = False  # an attempt past the buffer can no longer be replayed
            i += 1
            yield item


class RetryingStream(grpc.Call, grpc.Future):  # type: ignore[misc]
    """A response stream that starts a new attempt while no message has been received yet.

    ``start()`` begins an attempt and returns its call (a response iterator that is also a grpc.Call and
    grpc.Future); ``retry_delay(error)`` returns the backoff before the next attempt or None to give up.
    After the first message the stream is committed and simply delegates.
    """

    def __init__(
        self,
        start: Callable[[], Any],
        retry_delay: Callable[[grpc.RpcError], float | None],
    ) -> None:
        self._start = start
        self._retry_delay = retry_delay
        self._committed = False
        self._cancelled = False
        self._call = start()

    def __iter__(self) -> RetryingStream:
        return self

    def __next__(self) -> Any:
        if self._committed:
            return next(self._call)
        while True:
            try:
                item = next(self._call)
            except grpc.RpcError as e:
                if self._cancelled:
                    raise
                delay = self._retry_delay(e)
                if delay is None:
                    self._committed = True
                    raise
                if delay:
                    time.sleep(delay)
                if self._cancelled:
                    raise
                self._call = self._start()
                continue
            self._committed = True
            return item

    # grpc.Call / grpc.Future, delegated to the current attempt
    def initial_metadata(self) -> Any:
        return self._call.initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._call.trailing_metadata()

    def code(self) -> Any:
        return self._call.code()

    def details(self) -> Any:
        return self._call.details()

    def is_active(self) -> bool:
        return bool(self._call.is_active())

    def time_remaining(self) -> Any:
        return self._call.time_remaining()

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def add_callback(self, callback: Any) -> bool:
        return bool(self._call.add_callback(callback))

    def cancelled(self) -> bool:
        return bool(self._call.cancelled())

    def running(self) -> bool:
        return bool(self._call.running())

    def done(self) -> bool:
        return bool(self._call.done())

    def result(self, timeout: float | None = None) -> Any:
        return self._call.result(timeout)

    def exception(self, timeout: float | None = None) -> Any:
        return self._call.exception(timeout)

    def traceback(self, timeout: float | None = None) -> Any:
        return self._call.traceback(timeout)

    def add_done_callback(self, fn: Any) -> None:
        self._call.add_done_callback(lambda _c: fn(self))

    def debug_error_string(self) -> Any:
        return self._call.debug_error_string()
