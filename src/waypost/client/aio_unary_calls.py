"""The grpc.aio unary-response calls (unary_unary, stream_unary) of ``waypost.aio.dial`` and the multicallables
that make them: a task runs the attempts, except a unary-unary call whose first attempt can start at once (see
UnaryUnaryCall). Built on ``aio_call_base``; the stream-response kinds are in ``aio_stream_calls``."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from .._grpc_private import PLAIN_UNARY_UNARY_CALL, locally_cancelled
from ..balancer.base import PickResult
from ..types import CallMetadata
from .aio_call_base import AioMethod, CallBase, status_now
from .aio_replay import replay_for
from .hedging_aio import HedgedUnaryUnaryCall
from .subconn import SubConn

log = logging.getLogger("waypost.aio")

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN


def _call_back(callback: Callable[[Any], None], call: Any, _task: Any) -> None:
    callback(call)


class _UnaryResponseCall(CallBase):
    """unary_unary and stream_unary: a task runs the attempts; awaiting the call awaits it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._task = self._loop.create_task(self._run())

    async def _run(self, started: tuple[PickResult, SubConn, Any, float] | BaseException | None = None,
                   delay: float | None = None) -> Any:
        """The attempts. ``started``: the first attempt, already started (or the error starting it raised);
        ``delay``: the first attempt already failed and is to be retried after ``delay`` seconds."""
        m = self._m
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
                        res, sc, call, t0 = await self._start_attempt(req)
                    except BaseException as e:
                        self._fail_start(e)
                        raise
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
                        m.finish(res, sc, t0, _CANCELLED)
                        raise
                    if code is not e.code():
                        e = grpc.aio.AioRpcError(code, e.initial_metadata(), e.trailing_metadata(), details)
                    m.finish(res, sc, t0, code, e)
                    delay = self._decide(call, code, details)
                    if delay is None:
                        self._error = e = m.explained_aio(e, sc)
                        raise e from None
                    if delay:
                        await asyncio.sleep(delay)
                    if not self._replayable():  # the requests outgrew the buffer during the backoff
                        self._error = e
                        raise e from None
                    req = self._next_request()
                    continue
                except asyncio.CancelledError:
                    m.finish(res, sc, t0, _CANCELLED)
                    call.cancel()
                    raise
                except BaseException:
                    m.finish(res, sc, t0, _UNKNOWN)
                    raise
                m.finish(res, sc, t0, _OK, call, True)
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

    def __init__(self, m: AioMethod, request: Any, timeout: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None, credentials: grpc.CallCredentials | None,
                 wait_for_ready: bool | None, compression: grpc.Compression | None) -> None:
        CallBase.__init__(self, m, request, timeout, metadata, credentials, wait_for_ready, compression)
        # True while the first attempt runs without a task of ours (then ``_first`` is its grpc.aio call, and
        # ``_task`` is set only if it is retried)
        self._fast = False
        self._first: Any = None
        self._attempt: tuple[PickResult, SubConn, Any, float] | None = None
        self._user_cancelled = False
        started = self._start_now(request)
        if isinstance(started, tuple) and type(started[2]) is PLAIN_UNARY_UNARY_CALL:
            self._fast = True
            self._attempt = started
            self._first = started[2]
            self._first.add_done_callback(self._first_done)
        else:  # a pick that waits, an error to raise when awaited, or interceptors: the task path
            self._task = self._loop.create_task(self._run(started))

    def _first_done(self, call: Any) -> None:
        """The first attempt ended (grpc.aio's done callback): report it, and retry in a task if the policy says."""
        try:
            self._end_first(call)
        except Exception:  # runs inside grpc.aio's status handling: nothing may escape into it
            log.exception("waypost: handling the end of %r failed", call)

    def _end_first(self, call: Any) -> None:
        assert self._attempt is not None
        res, sc, _call, t0 = self._attempt
        status = status_now(call)
        code, details = status if status is not None else (_UNKNOWN, "")
        ok = code is _OK
        self._m.finish(res, sc, t0, code, call, ok)
        if not ok and not (self._user_cancelled or locally_cancelled(call)):  # a local cancel is never retried
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
            except grpc.aio.AioRpcError as e:
                if self._fast:  # not retried (decided before this awaiter woke up)
                    assert self._attempt is not None
                    raise self._m.explained_aio(e, self._attempt[1]) from None
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


# ---- the multicallables ------------------------------------------------------------------------


class UnaryUnaryMultiCallable(AioMethod, grpc.aio.UnaryUnaryMultiCallable):
    _kind = "unary_unary"

    def __call__(self, request: Any, *, timeout: float | None = None,
                 metadata: CallMetadata | grpc.aio.Metadata | None = None,
                 credentials: grpc.CallCredentials | None = None,
                 wait_for_ready: bool | None = None,
                 compression: grpc.Compression | None = None) -> UnaryUnaryCall | HedgedUnaryUnaryCall:
        cls = HedgedUnaryUnaryCall if self.hedging is not None else UnaryUnaryCall
        return self.started_call(lambda: cls(self, request, timeout, metadata, credentials, wait_for_ready,
                                             compression))


class StreamUnaryMultiCallable(AioMethod, grpc.aio.StreamUnaryMultiCallable):
    _kind = "stream_unary"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None,
                 metadata: CallMetadata | grpc.aio.Metadata | None = None,
                 credentials: grpc.CallCredentials | None = None, wait_for_ready: bool | None = None,
                 compression: grpc.Compression | None = None
                 ) -> StreamUnaryCall:
        return self.started_call(lambda: StreamUnaryCall(self, None, timeout, metadata, credentials, wait_for_ready,
                                                         compression, **replay_for(request_iterator)))
