"""The grpc.aio call objects and multicallables behind ``waypost.aio.dial``.

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
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .. import metrics as _metrics
from ..balancer.base import Outcome, PickError, PickInfo, PickResult
from ..balancer.hashkey import current_hash_key
from ..retry import Replay, RetryState, avoid_tried
from .rpcerror import BalancerRpcError
from .subconn import SubConn

if TYPE_CHECKING:
    from ..aio import Channel

log = logging.getLogger("waypost.aio")

_OK = grpc.StatusCode.OK
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN
_perf = time.perf_counter
_mono = time.monotonic
EOF_ = grpc.aio.EOF


def _aio_error(e: BalancerRpcError | PickError) -> grpc.aio.AioRpcError:
    if isinstance(e, PickError):
        code, details = e.code, e.message
    else:
        code, details = e.code(), e.details()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, f"waypost: {details}")


class _Method:
    _kind = ""

    def __init__(self, channel: Channel, method: str, ser: Any, deser: Any, registered: Any) -> None:
        self._ch = channel
        self._b = channel._balancer
        self._method = method
        self._ser = ser
        self._deser = deser
        self._registered = registered
        self._key = (self._kind, method, ser, deser)
        self._info = PickInfo(method)
        mc = channel._config.method_config(method)
        self._timeout = mc.timeout if mc is not None else None
        self._wfr = mc.wait_for_ready if mc is not None else None
        self._retry = mc.retry_policy if mc is not None else None
        self._throttle = channel._config.throttle
        self._rng = channel._config.rng

    def _inner(self, sc: SubConn) -> Any:
        mc = sc.mcs.get(self._key)
        if mc is None:
            mc = getattr(sc.channel, self._kind)(self._method, request_serializer=self._ser,
                                                 response_deserializer=self._deser,
                                                 _registered_method=self._registered)
            sc.mcs[self._key] = mc
        return mc

    def _pick_info(self, metadata: Any) -> PickInfo:
        hk = current_hash_key()
        if hk is None and not metadata:
            return self._info
        return PickInfo(self._method, hk, tuple(metadata or ()))

    def _finish(self, res: PickResult, sc: SubConn, t0: float, code: grpc.StatusCode) -> None:
        sc.inflight -= 1
        latency = _perf() - t0
        res.done(Outcome(code, latency))
        obs = _metrics.current
        if obs is not None:
            obs.call_done(self._b.target, sc.address, code, latency)
        if code is _UNAVAILABLE:
            self._b.call_failed(sc, code)


class _Call(abc.ABC):
    """What every call kind shares: settings, the attempt start (pick, maybe wait) and the Call API."""

    def __init__(self, m: _Method, request: Any, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any, retryable: bool = True) -> None:
        self._m = m
        self._request = request
        if timeout is None:
            timeout = m._timeout
        self._wfr = m._wfr if wait_for_ready is None else wait_for_ready
        self._metadata = metadata
        self._credentials = credentials
        self._compression = compression
        deadline = None if timeout is None else _mono() + timeout
        self._st = RetryState(m._retry if retryable else None, m._throttle, m._rng, deadline)
        self._call: Any = None  # the current attempt's grpc.aio call
        self._error: grpc.aio.AioRpcError | None = None
        self._loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = self._loop.create_future()
        self._callbacks: list[Callable[[Any], None]] = []

    async def _start_attempt(self, request: Any) -> tuple[PickResult, SubConn, Any]:
        m, st = self._m, self._st
        info = m._pick_info(self._metadata)
        try:
            r = m._b.pick(info)
            if r is None:
                r = await m._ch._wait_pick(info, st.deadline, self._wfr)
        except (PickError, BalancerRpcError) as e:
            raise _aio_error(e) from None
        if st.tried:
            r = avoid_tried(r, st.tried, lambda: list(m._b._snap.subconns.values()), lambda: m._b.pick(info))
        st.tried.add(r[1].address)
        res, sc = r
        md = st.metadata(self._metadata)
        call = m._inner(sc)(request, timeout=st.timeout(), metadata=md, credentials=self._credentials,
                            wait_for_ready=self._wfr, compression=self._compression)
        sc.inflight += 1
        self._call = call
        if not self._started.done():
            self._started.set_result(None)
        return res, sc, call

    def _fail_start(self, e: BaseException) -> None:
        if isinstance(e, grpc.aio.AioRpcError):
            self._error = e
        if not self._started.done():
            self._started.set_result(None)

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
        await self._started
        if self._call is None:
            return self._error.initial_metadata() if self._error is not None else grpc.aio.Metadata()
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        await self._final()
        if self._error is not None:
            return self._error.trailing_metadata()
        return await self._call.trailing_metadata() if self._call is not None else grpc.aio.Metadata()

    async def wait_for_connection(self) -> None:
        await self._started
        if self._call is not None:
            await self._call.wait_for_connection()

    def time_remaining(self) -> float | None:
        d = self._st.deadline
        return None if d is None else max(d - _mono(), 0.0)


class _UnaryResponseCall(_Call):
    """unary_unary and stream_unary: a task runs the attempts; awaiting the call awaits it."""

    def __init__(self, *args: Any, replay: Replay | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._replay = replay
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> Any:
        st, m = self._st, self._m
        while True:
            req = self._request if self._replay is None else self._replay.attempt()
            try:
                res, sc, call = await self._start_attempt(req)
            except BaseException as e:
                self._fail_start(e)
                raise
            t0 = _perf()
            try:
                resp = await call
            except grpc.aio.AioRpcError as e:
                code = e.code()
                m._finish(res, sc, t0, code)
                delay = st.after_failure(code, e.details())
                if delay is None or (self._replay is not None and not self._replay.replayable):
                    self._error = e
                    raise
                if delay:
                    await asyncio.sleep(delay)
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

    def __await__(self) -> Any:
        return self._task.__await__()

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

    # stream_unary write API (only when no request iterator was given)
    async def write(self, request: Any) -> None:
        await self._started
        if self._call is None:
            raise self._error or grpc.aio.UsageError("call failed before it started")
        await self._call.write(request)

    async def done_writing(self) -> None:
        await self._started
        if self._call is not None:
            await self._call.done_writing()


class UnaryUnaryCall(_UnaryResponseCall, grpc.aio.UnaryUnaryCall):
    pass


class StreamUnaryCall(_UnaryResponseCall, grpc.aio.StreamUnaryCall):
    pass


class _StreamResponseCall(_Call):
    """unary_stream and stream_stream: reading drives the attempts; retried only before the first message."""

    def __init__(self, *args: Any, replay: Replay | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._replay = replay
        self._committed = False
        self._cancelled = False
        self._done_fut: asyncio.Future[None] = self._loop.create_future()
        self._attempt: tuple[PickResult, SubConn, Any] | None = None
        self._task = self._loop.create_task(self._begin())

    async def _begin(self) -> None:
        try:
            req = self._request if self._replay is None else self._replay.attempt()
            res, sc, call = await self._start_attempt(req)
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

        call.add_done_callback(lambda _c: self._loop.create_task(report()))

    def _set_done(self) -> None:
        if not self._done_fut.done():
            self._done_fut.set_result(None)
        for cb in self._callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("waypost: call done callback failed")
        self._callbacks.clear()

    async def read(self) -> Any:
        await self._task
        while True:
            if self._error is not None:
                raise self._error
            call = self._call
            try:
                msg = await call.read()
            except grpc.aio.AioRpcError as e:
                if self._committed or self._cancelled:
                    raise
                delay = None if (self._replay is not None and not self._replay.replayable) else \
                    self._st.after_failure(e.code(), e.details())
                if delay is None:
                    self._committed = True
                    self._error = e
                    raise
                if delay:
                    await asyncio.sleep(delay)
                req = self._request if self._replay is None else self._replay.attempt()
                try:
                    res, sc, call = await self._start_attempt(req)
                except grpc.aio.AioRpcError as e2:
                    self._committed = True
                    self._error = e2
                    self._set_done()
                    raise
                self._watch(res, sc, call)
                continue
            if not self._committed:
                self._committed = True
                if msg is not EOF_:
                    self._st.succeeded()
            return msg

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
        await self._started
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
        if self._call is not None:
            return bool(self._call.cancel())
        return self._task.cancel()

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

    async def write(self, request: Any) -> None:
        await self._started
        if self._call is None:
            raise self._error or grpc.aio.UsageError("call failed before it started")
        await self._call.write(request)

    async def done_writing(self) -> None:
        await self._started
        if self._call is not None:
            await self._call.done_writing()


class UnaryStreamCall(_StreamResponseCall, grpc.aio.UnaryStreamCall):
    pass


class StreamStreamCall(_StreamResponseCall, grpc.aio.StreamStreamCall):
    pass


def _replay_for(request_iterator: Any) -> tuple[Any, Replay | None, bool]:
    """(request for the first attempt, replay buffer, retryable)."""
    if request_iterator is None or hasattr(request_iterator, "__aiter__"):
        return request_iterator, None, False
    return None, Replay(request_iterator), True


class UnaryUnaryMultiCallable(_Method, grpc.aio.UnaryUnaryMultiCallable):
    _kind = "unary_unary"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryUnaryCall:
        return UnaryUnaryCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_Method, grpc.aio.UnaryStreamMultiCallable):
    _kind = "unary_stream"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryStreamCall:
        return UnaryStreamCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class StreamUnaryMultiCallable(_Method, grpc.aio.StreamUnaryMultiCallable):
    _kind = "stream_unary"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamUnaryCall:
        req, replay, retryable = _replay_for(request_iterator)
        return StreamUnaryCall(self, req, timeout, metadata, credentials, wait_for_ready, compression,
                               retryable=retryable, replay=replay)


class StreamStreamMultiCallable(_Method, grpc.aio.StreamStreamMultiCallable):
    _kind = "stream_stream"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamStreamCall:
        req, replay, retryable = _replay_for(request_iterator)
        return StreamStreamCall(self, req, timeout, metadata, credentials, wait_for_ready, compression,
                                retryable=retryable, replay=replay)
