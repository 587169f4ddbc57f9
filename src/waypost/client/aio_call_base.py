"""What the grpc.aio call objects behind ``waypost.aio.dial`` share: the bottom of the aio call modules.

Layers (each imports only the ones below it): this module (``AioMethod``, ``CallBase``, the status helpers) <- the
call kinds and the multicallables that make them (``aio_unary_calls``, ``aio_stream_calls``).
grpcio internals are read only through ``waypost._grpc_private``.

Each call picks a backend per attempt, runs it on that backend's grpc.aio channel, reports its outcome to the
picker through our own awaiting wrapper (``call.code()`` is a coroutine in grpc.aio, and interceptors wrap
call objects), and retries on another backend per the retry policy. See ``waypost.aio`` for the channel.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from .._grpc_private import status_of
from ..balancer.base import PickResult
from ..balancer.failure import pushback_of
from ..types import CallMetadata
from .aio_replay import AsyncReplay, WriteReplay
from .aio_wait import AioPickWaiter
from .method import AsyncBalancedChannel, Attempt, MethodBase, trailers_of
from .replay import Replay
from .retry import RetryState
from .rpcerror import BalancerRpcError
from .subconn import SubConn

log = logging.getLogger("waypost.aio")

_CANCELLED = grpc.StatusCode.CANCELLED
_INTERNAL = grpc.StatusCode.INTERNAL
_UNKNOWN = grpc.StatusCode.UNKNOWN
_mono = time.monotonic


# A send that fails as the call ends makes grpc.aio set this stand-in status (before or after the real one,
# which the receive side sets): retry decisions wait for the real status, up to _SETTLE_S seconds.
_STAND_IN = "Internal error from Core"
_SETTLE_S = 5.0


def is_stand_in(code: grpc.StatusCode, details: str | None) -> bool:
    """The status is grpc.aio's stand-in for a failed send, not the call's real status (see _STAND_IN)."""
    return code is _INTERNAL and details == _STAND_IN


def status_now(call: Any) -> tuple[grpc.StatusCode, str] | None:
    """A finished grpc.aio call's status, read synchronously (from a done callback, which cannot await: the
    coroutines return at once when the status is in). None if it is not in."""
    s = status_of(call)  # the plain call object: its status, read directly (once per call: keep it cheap)
    if s is not None:
        return s
    out = []
    for get in (call.code, call.details):
        coro = get()
        try:
            coro.send(None)
        except StopIteration as e:
            out.append(e.value)
            continue
        except Exception:  # noqa: BLE001
            return None
        coro.close()
        return None
    return out[0], out[1]


async def messages(call: Any) -> AsyncIterator[Any]:
    """A stream call's responses, read with its ``read()`` until EOF: what ``async for`` over the call iterates."""
    while (msg := await call.read()) is not grpc.aio.EOF:
        yield msg


def aio_error(e: BalancerRpcError) -> grpc.aio.AioRpcError:
    """The grpc.aio error for a call that got no backend (``MethodBase.begin``, ``AioPickWaiter.wait_pick``)."""
    code, details = e.code(), e.details()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, f"waypost: {details}")


class AioMethod(MethodBase[AsyncBalancedChannel]):
    """A grpc.aio multicallable (the four kinds: ``aio_unary_calls``, ``aio_stream_calls``): a ``MethodBase``
    that also holds its channel's ``AioPickWaiter``, where its calls await a pick when no backend is usable
    right now."""

    def __init__(self, channel: AsyncBalancedChannel, method: str, request_serializer: Any,
                 response_deserializer: Any, registered: Any) -> None:
        super().__init__(channel, method, request_serializer, response_deserializer, registered)
        self.waiter: AioPickWaiter = channel.waiter


class CallBase(abc.ABC):
    """What every call kind shares: settings, the attempt start (pick, maybe wait) and the Call API."""

    def __init__(self, m: AioMethod, request: Any, timeout: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None,
                 credentials: grpc.CallCredentials | None,
                 wait_for_ready: bool | None, compression: grpc.Compression | None, *,
                 replay: Replay | AsyncReplay | None = None, writes: WriteReplay | None = None) -> None:
        self._m = m
        self._request = request
        self._replay = replay  # client streaming from an iterator: its items, recorded for replay
        self._writes = writes  # client streaming through write()/done_writing(): the written messages
        self._decided: tuple[Any, float | None] | None = None  # (failed attempt's call, its retry delay or None)
        self._committed = False  # streams: a response message was received (no more retries)
        self._real: tuple[Any, grpc.StatusCode, str] | None = None  # (attempt's call, its real status)
        self._waiters: list[asyncio.Future[None]] = []  # woken when _real or _decided changes
        self._deadline, self._wfr = m.settings(timeout, wait_for_ready)
        self._metadata = metadata
        self._credentials = credentials
        self._compression = compression
        self._st: RetryState | None = None  # made when an attempt fails (``_retry``): most calls need none
        self._address = ""  # the backend of the current attempt
        self._call: Any = None  # the current attempt's grpc.aio call
        self._error: grpc.aio.AioRpcError | None = None
        self._loop = asyncio.get_running_loop()
        # the first attempt started (or failed to): made only if someone waits for it before then
        self._started: asyncio.Future[None] | None = None
        self._is_started = False
        self._callbacks: list[Callable[[Any], None]] = []

    async def _start_attempt(self, request: Any) -> tuple[PickResult, SubConn, Any, float]:
        """Pick a backend (awaiting one when none is usable now; a retry avoids the backends tried already) and
        start an attempt there: (pick result, subconn, its grpc.aio call, start time)."""
        m, st, md, deadline = self._m, self._st, self._metadata, self._deadline
        tried = None if st is None else st.tried
        try:
            a = m.begin(md, deadline, tried)
            if a is None:
                r = await m.waiter.wait_pick(m.pick_info(md), deadline, self._wfr, tried or ())
                a = m.begin(md, deadline, tried, picked=r)
        except BalancerRpcError as e:
            raise aio_error(e) from None
        return a[0], a[1], self._launch(a, request), a[3]

    def _start_now(self, request: Any) -> tuple[PickResult, SubConn, Any, float] | BaseException | None:
        """Start the first attempt now, without awaiting, if a backend is ready: (pick result, subconn, call, start
        time), or the error starting it raised (to raise when the call is awaited), or None when the pick has
        to wait (``_start_attempt``)."""
        try:
            a = self._m.begin(self._metadata, self._deadline)
            if a is None:
                return None
            call = self._launch(a, request)
        except BalancerRpcError as e:
            return aio_error(e)
        except Exception as e:  # noqa: BLE001  # raised when the call is awaited, as the task path does
            return e
        return a[0], a[1], call, a[3]

    def _launch(self, a: Attempt, request: Any) -> Any:
        """Start the attempt ``a`` (from ``MethodBase.begin``) on its backend; returns its grpc.aio call."""
        res, sc, mc, t0, timeout = a
        st = self._st
        md = self._metadata if st is None else st.metadata(self._metadata)  # a retry says how many came before
        try:
            # wait_for_ready is the balanced channel's, never the backend's: see MethodBase.begin
            call = mc(request, timeout=timeout, metadata=md, credentials=self._credentials, compression=self._compression)
        except BaseException:
            self._m.finish(res, sc, t0, _UNKNOWN)
            raise
        self._address = sc.address
        self._call = call
        self._mark_started()
        return call

    def _retry(self) -> RetryState:
        """The call's retry state, made at its first use: after the first attempt (on ``_address``) failed."""
        st = self._st
        if st is None:
            st = self._st = self._m.retry_state(self._deadline, self._address)
        return st

    def _mark_started(self) -> None:
        self._is_started = True
        f = self._started
        if f is not None and not f.done():
            f.set_result(None)

    async def _until_started(self) -> None:
        if self._is_started:
            return
        if self._started is None:
            self._started = self._loop.create_future()
        await asyncio.shield(self._started)  # a cancelled waiter must not cancel it for the others

    def _fail_start(self, e: BaseException) -> None:
        if isinstance(e, grpc.aio.AioRpcError):
            self._error = e
        self._mark_started()

    # retries ------------------------------------------------------------------------------------

    def _next_request(self) -> Any:
        """The request (iterator) for a new attempt: a fresh replay of the client stream when there is one."""
        return self._request if self._replay is None else self._replay.attempt()

    def _replayable(self) -> bool:
        """False once the requests outgrew the replay buffer: the call is committed to its attempt."""
        return (self._replay is None or self._replay.replayable) and (self._writes is None or self._writes.replayable)

    def _decide(self, call: Any, code: grpc.StatusCode, details: str | None) -> float | None:
        """The attempt on ``call`` failed before any response message: the delay before the next attempt, or
        None (the call ends). Decided once per attempt (writers waiting for it and ``cancel`` read it)."""
        d = self._decided
        if d is not None and d[0] is call:
            return d[1]
        delay = self._retry().after_failure(code, details, pushback_of(trailers_of(call)))
        if delay is not None and not self._replayable():
            delay = None
        self._decided = (call, delay)
        self._wake()
        return delay

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _change(self) -> asyncio.Future[None]:
        """A future resolved at the next change of the attempt's real status or retry decision."""
        w = self._loop.create_future()
        self._waiters.append(w)
        return w

    def _note_status(self, call: Any) -> None:
        """Done callback of a client-streaming attempt (runs each time grpc.aio sets its status): keep the real one."""
        s = status_now(call)
        if s is not None and not is_stand_in(*s):
            self._real = (call, s[0], s[1])
            self._wake()

    async def _settle(self, call: Any, code: grpc.StatusCode, details: str | None
                      ) -> tuple[grpc.StatusCode, str | None]:
        """The real status of a failed attempt, in place of grpc.aio's stand-in (see _STAND_IN)."""
        if not is_stand_in(code, details):
            return code, details
        deadline = _mono() + _SETTLE_S
        while True:
            r = self._real
            if r is not None and r[0] is call:
                return r[1], r[2]
            left = deadline - _mono()
            if left <= 0:
                return code, details
            w = self._change()
            await asyncio.wait((w,), timeout=left)
            w.cancel()

    def _current(self) -> Any:
        return self._call

    def _release_replay(self, cancelled: bool) -> None:
        # The call is over: no task may stay parked in the request source for an abandoned attempt.
        if isinstance(self._replay, AsyncReplay):
            self._replay.abort(stale_only=not cancelled)

    # client-streaming write API (when no request iterator was given) -----------------------------

    async def write(self, request: Any) -> None:
        """Send one request message. With retries: recorded, and replayed into the next attempt when the
        current one fails before any response message."""
        await self._until_started()
        call = self._call
        if call is None:
            raise self._error or grpc.aio.UsageError("call failed before it started")
        w = self._writes
        if w is None:  # an iterator was given (or not a client stream): grpc.aio raises its usage error
            await call.write(request)
            return
        if w.closed:
            raise asyncio.InvalidStateError("RPC is half closed after calling done_writing.")
        recorded = w.record(request)
        call, err = await (w.feed(self._current) if recorded else w.feed(self._current, request))
        if err is None:
            return
        # The attempt is over. A recorded message goes to the next attempt if the call retries; otherwise the
        # error is the call's, raised as grpc.aio would.
        if recorded and await self._retrying(call):
            return
        raise self._write_error(call, err)

    async def done_writing(self) -> None:
        """Half-close the request stream (idempotent; a retry half-closes its attempt after the replay)."""
        await self._until_started()
        w = self._writes
        if w is None:
            if self._call is not None:
                await self._call.done_writing()
            return
        if self._call is None:
            return
        w.closed = True
        await w.feed(self._current)  # a finished attempt needs nothing: as grpc.aio, no error here

    def _write_error(self, call: Any, err: BaseException) -> BaseException:
        """What a write into a finished call raises: grpc.aio's error, with the call's real status in place of
        grpc.aio's stand-in (see _STAND_IN)."""
        if not isinstance(err, grpc.aio.AioRpcError) or not is_stand_in(err.code(), err.details()):
            return err
        if self._error is not None:
            return self._error
        r = self._real
        if r is not None and r[0] is call:
            return grpc.aio.AioRpcError(r[1], err.initial_metadata(), err.trailing_metadata(), r[2])
        return err

    @abc.abstractmethod
    async def _retrying(self, call: Any) -> bool:
        """A write found the attempt on ``call`` over: may the call go on with another attempt?"""

    # grpc.aio.Call API -------------------------------------------------------------------------

    @abc.abstractmethod
    async def _final(self) -> None:
        """Wait until the call has ended (the unary and streaming kinds know how)."""

    async def code(self) -> grpc.StatusCode:
        await self._final()
        if self._error is not None:
            return self._error.code()
        if self._call is None:
            return _CANCELLED
        return await self._call.code()  # type: ignore[no-any-return]

    async def details(self) -> str:
        await self._final()
        if self._error is not None:
            return self._error.details() or ""
        return await self._call.details() if self._call is not None else ""  # type: ignore[no-any-return]

    async def initial_metadata(self) -> Any:
        await self._until_started()
        if self._call is None:
            return self._error.initial_metadata() if self._error is not None else grpc.aio.Metadata()
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        await self._final()
        if self._error is not None:
            return self._error.trailing_metadata()
        return await self._call.trailing_metadata() if self._call is not None else grpc.aio.Metadata()

    async def wait_for_connection(self) -> None:
        await self._until_started()
        if self._call is not None:
            await self._call.wait_for_connection()

    def time_remaining(self) -> float | None:
        d = self._deadline
        return None if d is None else max(d - _mono(), 0.0)
