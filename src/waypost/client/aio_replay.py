"""The grpc.aio client-streaming request replay: an async request iterator (``AsyncReplay``) and the
``write()`` / ``done_writing()`` side of a call (``WriteReplay``), each replayable into a later attempt;
``replay_for`` picks the one a call needs.

The sync iterator and the limit (``REPLAY_LIMIT``) are in ``replay``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from .._grpc_private import EXECUTE_BATCH_ERROR
from .replay import REPLAY_LIMIT, Replay


class AsyncReplay:
    """An async request iterator that can be replayed by a later attempt (grpc.aio client-streaming retries).

    The async counterpart of ``replay.Replay``: items are recorded as attempts consume them, and past ``limit``
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


def replay_for(request_iterator: Any) -> dict[str, Any]:
    """How a grpc.aio client-streaming call keeps its requests for replay into a retry, as the call's keyword
    argument: a sync or async iterator (``replay``), or the write API when there is no iterator (``writes``)."""
    if request_iterator is None:
        return {"writes": WriteReplay()}
    if hasattr(request_iterator, "__aiter__"):
        return {"replay": AsyncReplay(request_iterator)}
    return {"replay": Replay(request_iterator)}
