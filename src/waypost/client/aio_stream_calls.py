"""The grpc.aio stream-response calls (unary_stream, stream_stream) of ``waypost.aio.dial`` and the
multicallables that make them: reading drives the attempts; retried only before the first response message.
Built on ``aio_call_base``; the unary-response kinds are in ``aio_unary_calls``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any

import grpc
import grpc.aio

from ..balancer.base import PickResult
from ..types import CallMetadata
from .aio_call_base import AioMethod, CallBase, is_stand_in, messages, status_now
from .aio_replay import replay_for
from .hedging_aio import HedgedUnaryStreamCall
from .subconn import SubConn

log = logging.getLogger("waypost.aio")

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN
_EOF = grpc.aio.EOF


class _StreamResponseCall(CallBase):
    """unary_stream and stream_stream: reading drives the attempts; retried only before the first message."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._cancelled = False
        self._done_fut: asyncio.Future[None] = self._loop.create_future()
        self._task = self._loop.create_task(self._begin())

    async def _begin(self) -> None:
        try:
            res, sc, call, t0 = await self._start_attempt(self._next_request())
        except BaseException as e:
            self._fail_start(e)
            self._set_done()
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._watch(res, sc, call, t0)

    def _watch(self, res: PickResult, sc: SubConn, call: Any, t0: float) -> None:
        m = self._m

        async def report() -> None:
            try:
                code = await call.code()
            except BaseException:  # noqa: BLE001
                code = _UNKNOWN
            m.finish(res, sc, t0, code, call)
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
                if msg is not _EOF:
                    self._m.succeeded()
            return msg

    async def _retrying(self, call: Any) -> bool:
        # Reading decides (only it knows whether a response message came): go on unless the call is over.
        if self._error is not None or self._committed or self._cancelled:
            return False
        s = status_now(call)
        if s is None or is_stand_in(*s):
            return True  # the status is not in yet
        return s[0] is not _OK and self._retry().may_retry(*s)  # OK, or an error that is not retried: the call's end

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
            res, sc, call, t0 = await self._start_attempt(self._next_request())
        except grpc.aio.AioRpcError as e2:
            raise self._end(e2) from None
        self._watch(res, sc, call, t0)
        if self._cancelled:  # cancelled while waiting for a backend
            call.cancel()
            return
        if self._writes is not None:
            await self._writes.feed(self._current)  # replay; a failure shows on the next read

    def __aiter__(self) -> AsyncIterator[Any]:
        return messages(self)

    async def _final(self) -> None:
        # Wait for the current attempt to end; if a retry replaced it meanwhile, wait for that one.
        await self._until_started()
        while self._error is None and self._call is not None:
            call = self._call
            with suppress(Exception):  # the code is read again by the caller
                await call.code()
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


# ---- the multicallables ------------------------------------------------------------------------


class UnaryStreamMultiCallable(AioMethod, grpc.aio.UnaryStreamMultiCallable):
    _kind = "unary_stream"

    def __call__(self, request: Any, *, timeout: float | None = None,
                 metadata: CallMetadata | grpc.aio.Metadata | None = None,
                 credentials: grpc.CallCredentials | None = None,
                 wait_for_ready: bool | None = None,
                 compression: grpc.Compression | None = None) -> UnaryStreamCall | HedgedUnaryStreamCall:
        cls = HedgedUnaryStreamCall if self.hedging is not None else UnaryStreamCall
        return self.started_call(lambda: cls(self, request, timeout, metadata, credentials, wait_for_ready,
                                             compression))


class StreamStreamMultiCallable(AioMethod, grpc.aio.StreamStreamMultiCallable):
    _kind = "stream_stream"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None,
                 metadata: CallMetadata | grpc.aio.Metadata | None = None,
                 credentials: grpc.CallCredentials | None = None, wait_for_ready: bool | None = None,
                 compression: grpc.Compression | None = None
                 ) -> StreamStreamCall:
        return self.started_call(lambda: StreamStreamCall(self, None, timeout, metadata, credentials,
                                                          wait_for_ready, compression,
                                                          **replay_for(request_iterator)))
