"""The grpc.aio call objects behind ``waypost.aio.dial`` (the multicallables that make them: ``aio_methods``).

Each call picks a backend per attempt, runs it on that backend's grpc.aio channel, reports its outcome to the
picker through our own awaiting wrapper (``call.code()`` is a coroutine in grpc.aio, and interceptors wrap
call objects), and retries on another backend per the retry policy. See ``waypost.aio`` for the channel.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from ..balancer.base import PickError, PickResult
from ..retry import AsyncReplay, Replay, RetryState, WriteReplay, avoid_tried
from .rpcerror import BalancerRpcError
from .subconn import SubConn

if TYPE_CHECKING:
    from .aio_methods import _Method

log = logging.getLogger("waypost.aio")

_OK = grpc.StatusCode.OK
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN
_INTERNAL = grpc.StatusCode.INTERNAL
_perf = time.perf_counter
_mono = time.monotonic
EOF_ = grpc.aio.EOF


# A send that fails as the call ends makes grpc.aio set this stand-in status (before or after the real one,
# which the receive side sets): retry decisions wait for the real status, up to _SETTLE_S seconds.
_STAND_IN = "Internal error from Core"
_SETTLE_S = 5.0


def _stand_in(code: grpc.StatusCode, details: str | None) -> bool:
    return code is _INTERNAL and details == _STAND_IN


try:  # grpc's own map from the Cython status codes (private: _status_now falls back without it)
    from grpc._common import CYGRPC_STATUS_CODE_TO_STATUS_CODE as _CODE_OF
except ImportError:  # pragma: no cover
    _CODE_OF = {}


def _status_now(call: Any) -> tuple[grpc.StatusCode, str] | None:
    """A finished grpc.aio call's status, read synchronously (from a done callback, which cannot await: the
    coroutines return at once when the status is in). None if it is not in."""
    status = getattr(getattr(call, "_cython_call", None), "_status", None)
    if status is not None:  # the plain call object: its status, read directly (once per call: keep it cheap)
        code = _CODE_OF.get(status.code())
        if code is not None:
            return code, status.details()
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


#: grpc.aio's own unary-unary call object (without interceptors): its done callbacks run before its awaiters wake
_PLAIN_UNARY_UNARY = getattr(getattr(grpc.aio, "_call", None), "UnaryUnaryCall", None)


def _call_back(callback: Callable[[Any], None], call: Any, _task: Any) -> None:
    callback(call)


def _locally_cancelled(call: Any) -> bool:
    """The attempt was cancelled on this side (never retried, whatever the policy)."""
    cy = getattr(call, "_cython_call", None)
    if cy is not None and hasattr(cy, "is_locally_cancelled"):
        return bool(cy.is_locally_cancelled())
    return False


def _aio_error(e: BalancerRpcError | PickError) -> grpc.aio.AioRpcError:
    if isinstance(e, PickError):
        code, details = e.code, e.message
    else:
        code, details = e.code(), e.details()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, f"waypost: {details}")


class _Call(abc.ABC):
    """What every call kind shares: settings, the attempt start (pick, maybe wait) and the Call API."""

    def __init__(self, m: _Method, request: Any, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any, *, replay: Replay | AsyncReplay | None = None,
                 writes: WriteReplay | None = None) -> None:
        self._m = m
        self._request = request
        self._replay = replay  # client streaming from an iterator: its items, recorded for replay
        self._writes = writes  # client streaming through write()/done_writing(): the written messages
        self._decided: tuple[Any, float | None] | None = None  # (failed attempt's call, its retry delay or None)
        self._committed = False  # streams: a response message was received (no more retries)
        self._real: tuple[Any, grpc.StatusCode, str] | None = None  # (attempt's call, its real status)
        self._waiters: list[asyncio.Future[None]] = []  # woken when _real or _decided changes
        if timeout is None:
            timeout = m._timeout
        self._wfr = m._wfr if wait_for_ready is None else wait_for_ready
        self._metadata = metadata
        self._credentials = credentials
        self._compression = compression
        deadline = None if timeout is None else _mono() + timeout
        self._st = RetryState(m._retry, m._throttle, m._rng, deadline)
        self._call: Any = None  # the current attempt's grpc.aio call
        self._error: grpc.aio.AioRpcError | None = None
        self._loop = asyncio.get_running_loop()
        # the first attempt started (or failed to): made only if someone waits for it before then
        self._started: asyncio.Future[None] | None = None
        self._is_started = False
        self._callbacks: list[Callable[[Any], None]] = []

    async def _start_attempt(self, request: Any) -> tuple[PickResult, SubConn, Any]:
        m, st = self._m, self._st
        info = m._pick_info(self._metadata)
        try:
            r = m._b.pick(info)
            if r is None:
                r = await m._channel._wait_pick(info, st.deadline, self._wfr)
        except (PickError, BalancerRpcError) as e:
            raise _aio_error(e) from None
        if st.tried:
            r = avoid_tried(r, st.tried, lambda: list(m._b._snap.subconns.values()), lambda: m._b.pick(info))
        return r[0], r[1], self._launch(r[1], request)

    def _launch(self, sc: SubConn, request: Any) -> Any:
        """Start an attempt on the picked backend ``sc``; returns its grpc.aio call."""
        st = self._st
        st.tried.add(sc.address)
        call = self._m._inner(sc)(request, timeout=st.timeout(), metadata=st.metadata(self._metadata),
                                  credentials=self._credentials, wait_for_ready=self._wfr,
                                  compression=self._compression)
        sc.inflight += 1
        self._call = call
        self._mark_started()
        return call

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
        delay = self._st.after_failure(code, details)
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
        s = _status_now(call)
        if s is not None and not _stand_in(*s):
            self._real = (call, s[0], s[1])
            self._wake()

    async def _settle(self, call: Any, code: grpc.StatusCode, details: str | None
                      ) -> tuple[grpc.StatusCode, str | None]:
        """The real status of a failed attempt, in place of grpc.aio's stand-in (see _STAND_IN)."""
        if not _stand_in(code, details):
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
        if not isinstance(err, grpc.aio.AioRpcError) or not _stand_in(err.code(), err.details()):
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
        d = self._st.deadline
        return None if d is None else max(d - _mono(), 0.0)


class _UnaryResponseCall(_Call):
    """unary_unary and stream_unary: a task runs the attempts; awaiting the call awaits it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._task = self._loop.create_task(self._run())

    async def _run(self, started: tuple[PickResult, SubConn, Any, float] | BaseException | None = None,
                   delay: float | None = None) -> Any:
        """The attempts. ``started``: the first attempt, already started (or the error starting it raised);
        ``delay``: the first attempt already failed and is to be retried after ``delay`` seconds."""
        st, m = self._st, self._m
        req = self._next_request()
        first = delay is None
        cancelled = False
        try:
            if delay:
                await asyncio.sleep(delay)
            while True:
                if started is not None:
                    if isinstance(started, BaseException):
                        self._fail_start(started)
                        raise started
                    res, sc, call, t0 = started
                    started = None
                else:
                    try:
                        res, sc, call = await self._start_attempt(req)
                    except BaseException as e:
                        self._fail_start(e)
                        raise
                    t0 = _perf()
                if self._replay is not None or self._writes is not None:
                    call.add_done_callback(lambda c: self._note_status(c))
                try:
                    if not first and self._writes is not None:
                        await self._writes.feed(self._current)  # replay; a failure shows when awaiting the call
                    first = False
                    resp = await call
                except grpc.aio.AioRpcError as e:
                    try:
                        code, details = await self._settle(call, e.code(), e.details())
                    except asyncio.CancelledError:
                        m._finish(res, sc, t0, _CANCELLED)
                        raise
                    if code is not e.code():
                        e = grpc.aio.AioRpcError(code, e.initial_metadata(), e.trailing_metadata(), details)
                    m._finish(res, sc, t0, code)
                    delay = self._decide(call, code, details)
                    if delay is None:
                        self._error = e
                        raise e from None
                    if delay:
                        await asyncio.sleep(delay)
                    if not self._replayable():  # the requests outgrew the buffer during the backoff
                        self._error = e
                        raise e from None
                    req = self._next_request()
                    continue
                except asyncio.CancelledError:
                    m._finish(res, sc, t0, _CANCELLED)
                    call.cancel()
                    raise
                except BaseException:
                    m._finish(res, sc, t0, _UNKNOWN)
                    raise
                m._finish(res, sc, t0, _OK)
                st.succeeded()
                return resp
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._release_replay(cancelled)

    def __await__(self) -> Any:
        return self._task.__await__()

    async def _retrying(self, call: Any) -> bool:
        # The attempt task decides, from the attempt's real status: wait for it.
        while True:
            if self._error is not None or self._task.done():
                return False
            if call is not self._call:
                return True  # the next attempt started: it gets the recorded message in its replay
            d = self._decided
            if d is not None and d[0] is call:
                return d[1] is not None
            w = self._change()
            await asyncio.wait((self._task, w), return_when=asyncio.FIRST_COMPLETED)
            w.cancel()

    async def _final(self) -> None:
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise
        except Exception:  # noqa: BLE001, S110  # the outcome is read from _error / the call
            pass

    async def code(self) -> grpc.StatusCode:
        await self._final()
        if self._task.cancelled():
            return _CANCELLED
        return await super().code()

    def cancel(self) -> bool:
        if self._task.done():
            return False
        if self._call is not None:
            self._call.cancel()
        return self._task.cancel()

    def cancelled(self) -> bool:
        return self._task.cancelled()

    def done(self) -> bool:
        return self._task.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._task.add_done_callback(lambda _t: callback(self))


class UnaryUnaryCall(_UnaryResponseCall, grpc.aio.UnaryUnaryCall):
    """unary_unary. When a backend is ready at once (the usual case), the first attempt starts right here, as
    grpc.aio's own call does, and without interceptors it runs with no task of ours: awaiting the call awaits
    grpc.aio's call, and its end is handled in that call's done callback, which grpc.aio runs before anyone
    awaiting the call wakes up. Only a retry (or a pick that has to wait) runs in a task."""

    def __init__(self, m: _Method, request: Any, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any) -> None:
        _Call.__init__(self, m, request, timeout, metadata, credentials, wait_for_ready, compression)
        # True while the first attempt runs without a task of ours (then ``_first`` is its grpc.aio call, and
        # ``_task`` is set only if it is retried)
        self._fast = False
        self._first: Any = None
        self._attempt: tuple[PickResult, SubConn, Any, float] | None = None
        self._user_cancelled = False
        started = self._start_now(request)
        if isinstance(started, tuple) and type(started[2]) is _PLAIN_UNARY_UNARY:
            self._fast = True
            self._attempt = started
            self._first = started[2]
            self._first.add_done_callback(self._first_done)
        else:  # a pick that waits, an error to raise when awaited, or interceptors: the task path
            self._task = self._loop.create_task(self._run(started))

    def _start_now(self, request: Any) -> tuple[PickResult, SubConn, Any, float] | BaseException | None:
        """Start the first attempt now if a backend is ready: (pick result, subconn, call, start time), or the
        error starting it raised, or None when the pick has to wait."""
        m = self._m
        try:
            r = m._b.pick(m._pick_info(self._metadata))
            if r is None:
                return None
            call = self._launch(r[1], request)
        except (PickError, BalancerRpcError) as e:
            return _aio_error(e)
        except Exception as e:  # noqa: BLE001  # raised when the call is awaited, as the task path does
            return e
        return r[0], r[1], call, _perf()

    def _first_done(self, call: Any) -> None:
        """The first attempt ended (grpc.aio's done callback): report it, and retry in a task if the policy says."""
        try:
            self._end_first(call)
        except Exception:  # runs inside grpc.aio's status handling: nothing may escape into it
            log.exception("waypost: handling the end of %r failed", call)

    def _end_first(self, call: Any) -> None:
        assert self._attempt is not None
        res, sc, _call, t0 = self._attempt
        status = _status_now(call)
        code, details = status if status is not None else (_UNKNOWN, "")
        self._m._finish(res, sc, t0, code)
        if code is _OK:
            self._st.succeeded()
        elif not (self._user_cancelled or _locally_cancelled(call)):
            delay = self._decide(call, code, details)
            if delay is not None:
                task = self._task = self._loop.create_task(self._run(delay=delay))
                self._fast = False
                for cb in self._callbacks:
                    task.add_done_callback(functools.partial(_call_back, cb, self))
                self._callbacks.clear()
                return
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # as grpc.aio: a failing callback does not stop the others
                log.exception("done callback of %r failed", self)

    def __await__(self) -> Any:
        if self._fast:
            try:
                return (yield from self._first.__await__())
            except grpc.aio.AioRpcError:
                if self._fast:  # not retried (decided before this awaiter woke up)
                    raise
        return (yield from self._task.__await__())

    async def _final(self) -> None:
        if self._fast:
            await self._first.code()  # the first attempt's status (its done callback has run then)
            if self._fast:
                return
        await super()._final()

    async def code(self) -> grpc.StatusCode:
        if self._fast:
            await self._final()
        if self._fast:
            return await self._first.code()  # type: ignore[no-any-return]
        return await super().code()

    def cancel(self) -> bool:
        if self.done():
            return False
        self._user_cancelled = True
        if self._fast:
            return bool(self._first.cancel())
        return super().cancel()

    def cancelled(self) -> bool:
        return self._first.cancelled() if self._fast else self._task.cancelled()  # type: ignore[no-any-return]

    def done(self) -> bool:
        return self._first.done() if self._fast else self._task.done()  # type: ignore[no-any-return]

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if not self._fast:
            super().add_done_callback(callback)
        elif self._first.done():
            callback(self)
        else:
            self._callbacks.append(callback)


class StreamUnaryCall(_UnaryResponseCall, grpc.aio.StreamUnaryCall):
    pass


class _StreamResponseCall(_Call):
    """unary_stream and stream_stream: reading drives the attempts; retried only before the first message."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._cancelled = False
        self._done_fut: asyncio.Future[None] = self._loop.create_future()
        self._task = self._loop.create_task(self._begin())

    async def _begin(self) -> None:
        try:
            res, sc, call = await self._start_attempt(self._next_request())
        except BaseException as e:
            self._fail_start(e)
            self._set_done()
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._watch(res, sc, call)

    def _watch(self, res: PickResult, sc: SubConn, call: Any) -> None:
        t0 = _perf()
        m = self._m

        async def report() -> None:
            try:
                code = await call.code()
            except BaseException:  # noqa: BLE001
                code = _UNKNOWN
            m._finish(res, sc, t0, code)
            if self._committed or code is _OK or self._cancelled:
                self._set_done()

        reported = False

        def on_done(_c: Any) -> None:
            nonlocal reported
            if self._replay is not None or self._writes is not None:
                self._note_status(call)
            if not reported:  # grpc.aio may set a status twice (see _STAND_IN): report the attempt once
                reported = True
                self._loop.create_task(report())

        call.add_done_callback(on_done)

    def _set_done(self) -> None:
        if not self._done_fut.done():
            self._done_fut.set_result(None)
            self._release_replay(self._cancelled)
        for cb in self._callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("waypost: call done callback failed")
        self._callbacks.clear()

    def _end(self, e: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        self._committed = True
        self._error = e
        self._set_done()
        return e

    async def read(self) -> Any:
        try:
            await self._task
        except asyncio.CancelledError:
            self.cancel()  # as grpc.aio: a cancelled read cancels the RPC
            raise
        while True:
            if self._error is not None:
                raise self._error
            call = self._call
            try:
                msg = await call.read()
            except grpc.aio.AioRpcError as e:
                if self._committed or self._cancelled:
                    raise
                try:
                    await self._next_attempt(call, e)
                except asyncio.CancelledError:
                    self.cancel()
                    raise
                continue
            except asyncio.CancelledError:
                self.cancel()  # as grpc.aio: a cancelled read cancels the RPC
                raise
            if not self._committed:
                self._committed = True
                if msg is not EOF_:
                    self._st.succeeded()
            return msg

    async def _retrying(self, call: Any) -> bool:
        # Reading decides (only it knows whether a response message came): go on unless the call is over.
        if self._error is not None or self._committed or self._cancelled:
            return False
        s = _status_now(call)
        if s is None or _stand_in(*s):
            return True  # the status is not in yet
        return s[0] is not _OK and self._st.may_retry(*s)  # OK, or an error that is not retried: the call's end

    async def _next_attempt(self, call: Any, e: grpc.aio.AioRpcError) -> None:
        """The attempt on ``call`` failed before any response message: start the next one, or end the call."""
        code, details = await self._settle(call, e.code(), e.details())
        if code is not e.code():
            e = grpc.aio.AioRpcError(code, e.initial_metadata(), e.trailing_metadata(), details)
        delay = self._decide(call, code, details)
        if delay is None:
            raise self._end(e)
        if delay:
            await asyncio.sleep(delay)
        if self._error is not None:  # cancelled during the backoff
            raise self._error
        if not self._replayable():  # the requests outgrew the buffer during the backoff
            raise self._end(e)
        try:
            res, sc, call = await self._start_attempt(self._next_request())
        except grpc.aio.AioRpcError as e2:
            raise self._end(e2) from None
        self._watch(res, sc, call)
        if self._cancelled:  # cancelled while waiting for a backend
            call.cancel()
            return
        if self._writes is not None:
            await self._writes.feed(self._current)  # replay; a failure shows on the next read

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            msg = await self.read()
            if msg is EOF_:
                return
            yield msg

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _final(self) -> None:
        # Wait for the current attempt to end; if a retry replaced it meanwhile, wait for that one.
        await self._until_started()
        while self._error is None and self._call is not None:
            call = self._call
            try:
                await call.code()
            except Exception:  # noqa: BLE001, S110  # the code is read again by the caller
                pass
            if call is self._call:
                return
            await asyncio.sleep(0)

    def cancel(self) -> bool:
        self._cancelled = True
        self._release_replay(True)
        call = self._call
        if call is None:
            return self._task.cancel()
        d = self._decided
        if d is not None and d[0] is call and d[1] is not None and self._error is None:
            # Between attempts (the last one failed, a retry was due): the call ends here, cancelled.
            self._end(grpc.aio.AioRpcError(_CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           "Locally cancelled by application!"))
            return True
        return bool(call.cancel())

    def cancelled(self) -> bool:
        if self._call is not None:
            return bool(self._call.cancelled())
        return self._task.cancelled()

    def done(self) -> bool:
        if self._error is not None:
            return True
        return self._call is not None and bool(self._call.done()) and self._done_fut.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done_fut.done():
            callback(self)
        else:
            self._callbacks.append(callback)


class UnaryStreamCall(_StreamResponseCall, grpc.aio.UnaryStreamCall):
    pass


class StreamStreamCall(_StreamResponseCall, grpc.aio.StreamStreamCall):
    pass
