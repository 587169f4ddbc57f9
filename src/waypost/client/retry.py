"""Retry and failover across backends: per-call retry state, request replay, the retrying response stream.

gRPC's retry semantics (gRFC A6), done by the balanced channel so that each attempt is a fresh pick:
- only codes in ``retryableStatusCodes``, at most ``maxAttempts`` attempts, jittered exponential backoff;
- only while no response message has been received (streams: before the first message);
- the deadline covers all attempts; ``grpc-previous-rpc-attempts`` is sent on retries;
- ``retryThrottling``: a token bucket per channel gates retries;
- the next attempt goes to a backend not tried yet when there is one, waiting (within the deadline) for one
  still connecting when every READY backend was tried (``avoid_tried``);
- "transparent" retries: an attempt that failed before reaching any server (the connection was already
  gone) is re-picked at once, without counting as an attempt, even without a retry policy.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from .._grpc_private import EXECUTE_BATCH_ERROR
from ..balancer.base import Outcome, PickResult
from ..service_config import RetryPolicy
from .retry_throttle import RetryThrottle

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

#: At most this many transparent re-picks per call (a connection-level failure seen on pick after pick).
MAX_TRANSPARENT = 3

#: Requests of a client-streaming call kept for replay; beyond this the call is committed (no more retries).
REPLAY_LIMIT = 1024

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
    """Bookkeeping of one call's attempts (one object per call that may retry)."""

    __slots__ = ("attempts", "deadline", "policy", "rng", "started", "throttle", "transparent", "tried")

    def __init__(
        self,
        policy: RetryPolicy | None,
        throttle: RetryThrottle | None,
        rng: Rng,
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

    def may_retry(self, code: grpc.StatusCode, details: str | None) -> bool:
        """Whether a failure with this status could be retried (read-only: no throttle, backoff or deadline)."""
        if never_sent(code, details) and self.transparent < MAX_TRANSPARENT:
            return True
        policy = self.policy
        return policy is not None and code in policy.retryable_status_codes and self.attempts + 1 < policy.max_attempts

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
        delay = backoff_delay(policy, self.attempts, self.rng)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            return None
        return delay


def avoid_tried(
    picked: tuple[PickResult, Any],
    tried: Collection[str],
    ready: Iterable[Any],
    backends: Iterable[Any],
    repick: Callable[[], tuple[PickResult, Any] | None],
) -> tuple[PickResult, Any] | None:
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


class Replay:
    """A request iterator that can be replayed by a later attempt (client-streaming retries).

    Items are recorded as attempts consume them (under a lock: gRPC consumes request iterators on
    its own thread, and a failed attempt's thread may still be inside ``next``). Past ``limit`` items
    the call cannot be retried any more (``replayable`` turns False). Only the newest attempt reads
    the source: an older one ends instead, so it cannot take an item the newest would never see.
    """

    def __init__(self, source: Iterable[Any], limit: int = REPLAY_LIMIT) -> None:
        self._src = iter(source)
        self._buf: list[Any] = []
        self._lock = threading.Lock()
        self._exhausted = False
        self._limit = limit
        self._newest = 0
        self.replayable = True

    def attempt(self) -> Iterator[Any]:
        """A fresh iterator: the recorded items, then the rest of the source."""
        with self._lock:
            self._newest += 1
            me = self._newest
        return self._iterate(me)

    def _iterate(self, me: int) -> Iterator[Any]:
        i = 0
        while True:
            with self._lock:
                if i < len(self._buf):
                    item = self._buf[i]
                elif self._exhausted or me != self._newest:
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


class AsyncReplay:
    """An async request iterator that can be replayed by a later attempt (grpc.aio client-streaming retries).

    The async counterpart of :class:`Replay`: items are recorded as attempts consume them, and past ``limit``
    items the call cannot be retried any more (``replayable`` turns False; items are then kept only until
    the current attempt has taken them). ``attempt()`` gives each attempt a fresh iterator: the recorded items,
    then the rest of the source. The source is consumed once and never by two attempts at a time: a failed
    attempt's consumer may still be waiting inside the source when the next attempt starts, so the item it
    gets is recorded for the new attempt, and the old iterator ends (it is stale). Costs no task.
    """

    def __init__(self, source: AsyncIterable[Any], limit: int | None = None) -> None:
        self._src = source.__aiter__()
        self._buf: list[Any] = []
        self._base = 0  # index (in the source) of _buf[0]: consumed items are dropped once the call committed
        self._limit = REPLAY_LIMIT if limit is None else limit
        self._gen = 0  # the newest attempt; older attempts' iterators end
        self._exhausted = False
        self._error: BaseException | None = None  # what the source raised, raised again to later attempts
        self._puller: asyncio.Task[Any] | None = None  # the task inside the source's __anext__, if any
        self._puller_gen = 0  # the attempt it pulls for
        self._waiters: list[asyncio.Future[None]] = []
        self.replayable = True

    def attempt(self) -> AsyncIterator[Any]:
        """A fresh async iterator for a new attempt (earlier attempts' iterators stop yielding)."""
        self._gen += 1
        return _ReplayIterator(self, self._gen)

    def abort(self, stale_only: bool = False) -> None:
        """The call is over: interrupt a pull still running inside the source (as grpc.aio cancels its request
        consumer on cancel), so no task stays parked there. ``stale_only``: only for an abandoned attempt
        (the current attempt's consumer is grpc.aio's business)."""
        t = self._puller
        if t is None or t is asyncio.current_task() or (stale_only and self._puller_gen == self._gen):
            return
        t.cancel()

    async def _next(self, it: _ReplayIterator) -> Any:
        while True:
            if it._gen != self._gen:
                raise StopAsyncIteration  # a later attempt took over: this one's call is over
            j = it._i - self._base
            if j < 0:  # only after the call committed (callers check ``replayable`` before a new attempt)
                raise RuntimeError("waypost: requests past the replay limit cannot be replayed")
            buf = self._buf
            if j < len(buf):
                item = buf[j]
                it._i += 1
                if not self.replayable:
                    del buf[: j + 1]  # committed: nobody replays these any more
                    self._base += j + 1
                return item
            if self._error is not None:
                raise self._error
            if self._exhausted:
                raise StopAsyncIteration
            if self._puller is not None:  # an abandoned attempt is inside the source: share its item
                w = asyncio.get_running_loop().create_future()
                self._waiters.append(w)
                try:
                    await w
                finally:
                    if not w.done():
                        w.cancel()
                continue
            # Pull the next item (inline: this is the per-item path of every client-streaming call).
            self._puller = asyncio.current_task()
            self._puller_gen = it._gen
            try:
                item = await self._src.__anext__()
            except StopAsyncIteration:
                self._exhausted = True
            except asyncio.CancelledError:
                # Interrupted inside the source: its state is unknown (an async generator is finished). Later
                # attempts must not see a short, clean end of stream, so they fail instead.
                self._error = RuntimeError("waypost: the request iterator was interrupted by a cancelled attempt")
                raise
            except Exception as e:  # noqa: BLE001  # the source's own error: every attempt that reaches it sees it
                self._error = e
            else:
                buf.append(item)
                if self.replayable and self._base + len(buf) > self._limit:
                    self.replayable = False
                if it._gen == self._gen:  # the usual case: hand it over at once (it is at index j)
                    it._i += 1
                    if not self.replayable:
                        del buf[: j + 1]
                        self._base += j + 1
                    return item
            finally:
                self._puller = None
                if self._waiters:
                    waiters, self._waiters = self._waiters, []
                    for w in waiters:
                        if not w.done():
                            w.set_result(None)


class _ReplayIterator:
    """One attempt's view of an AsyncReplay (a class, not an async generator: nothing to finalize)."""

    __slots__ = ("_gen", "_i", "_r")

    def __init__(self, r: AsyncReplay, gen: int) -> None:
        self._r = r
        self._gen = gen
        self._i = 0

    def __aiter__(self) -> _ReplayIterator:
        return self

    def __anext__(self) -> Any:
        return self._r._next(self)


# What grpc.aio's write raises when the call is over (or ending: a send that failed as the status arrives).
_ATTEMPT_OVER: tuple[type[BaseException], ...] = (
    grpc.aio.AioRpcError, asyncio.InvalidStateError, EXECUTE_BATCH_ERROR)


class WriteReplay:
    """The ``write()`` / ``done_writing()`` side of a grpc.aio client-streaming call, replayable into a later attempt.

    Written messages are recorded (up to ``limit``; past it ``replayable`` turns False: the call commits to
    its attempt and later messages go to that attempt only). ``feed(call)`` brings an attempt up to date: a
    new attempt first gets every recorded message in order, then the half-close once ``done_writing`` was
    called. One writer at a time (a lock): the user's writes and a retry's replay never interleave.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._buf: list[Any] = []
        self._limit = REPLAY_LIMIT if limit is None else limit
        self._lock = asyncio.Lock()
        self._call: Any = None  # the attempt _fed counts for
        self._fed = 0
        self._half_closed = False
        self.closed = False  # done_writing was called
        self.replayable = True

    def record(self, message: Any) -> bool:
        """Keep ``message`` for replay; False once past the limit (the call is then committed)."""
        if self.replayable and len(self._buf) < self._limit:
            self._buf.append(message)
            return True
        self.replayable = False
        return False

    async def feed(self, current: Callable[[], Any], *unrecorded: Any) -> tuple[Any, BaseException | None]:
        """Write to the current attempt's call (``current()``, read once the lock is held) what it has not had
        yet, then the ``unrecorded`` messages, then the half-close if due. Returns (that call, None), or
        (that call, the error showing that the attempt is over: its status tells whether the call retries).
        Any other error (a message that does not serialize) is raised and that message is forgotten, as
        grpc.aio would not have sent it either."""
        async with self._lock:
            call = current()
            if self._call is not call:
                self._call, self._fed, self._half_closed = call, 0, False
            buf = self._buf
            try:
                while self._fed < len(buf):
                    await call.write(buf[self._fed])
                    self._fed += 1
                for message in unrecorded:
                    await call.write(message)
                if self.closed and not self._half_closed:
                    self._half_closed = True
                    await call.done_writing()
            except Exception as e:
                if call.done() or isinstance(e, _ATTEMPT_OVER):
                    return call, e
                if self._fed < len(buf):
                    del buf[self._fed]
                raise
        return call, None


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
