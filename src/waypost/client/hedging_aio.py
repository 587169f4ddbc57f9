"""Hedged calls of ``waypost.aio.dial`` (unary-unary and unary-stream methods with a ``hedgingPolicy``): the same
race as ``hedging_sync`` on the event loop. Each attempt is a grpc.aio call watched by a task (its response, or a
stream's first message or end); ``hedging.HedgePlan`` decides when the next one goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from ..types import CallMetadata
from .aio_call_base import AioMethod, aio_error, messages, status_now
from .hedging import RaceState
from .method import Attempt
from .rpcerror import BalancerRpcError

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN
_EOF = grpc.aio.EOF

# what an attempt reports: its response (unary), its first message, its end (stream: OK, no message), its error
_RESP, _MSG, _END, _ERR = "resp", "msg", "end", "err"


class _Attempt:
    __slots__ = ("call", "sc", "task")

    def __init__(self, call: Any, sc: Any) -> None:
        self.call = call
        self.sc = sc
        self.task: asyncio.Task[None] | None = None


class AioRace(RaceState):
    """The attempts of one hedged grpc.aio call; ``run`` returns (attempt, kind, payload) of the one that commits."""

    def __init__(self, m: AioMethod, request: Any, deadline: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None, credentials: grpc.CallCredentials | None,
                 wfr: bool | None, compression: grpc.Compression | None, *, stream: bool) -> None:
        super().__init__(m, request, deadline, metadata, credentials, wfr, compression, stream)
        self.m: AioMethod = m
        self._q: asyncio.Queue[tuple[_Attempt, str, Any]] = asyncio.Queue()

    async def _first(self) -> None:
        m, md, deadline = self.m, self._metadata, self._deadline
        try:
            a = m.begin(md, deadline, self.tried)
            if a is None:
                r = await m.waiter.wait_pick(m.pick_info(md), deadline, self._wfr)
                a = m.begin(md, deadline, self.tried, picked=r)
        except BalancerRpcError as e:
            raise aio_error(e) from None
        self._launch(a)

    def _launch(self, a: Attempt) -> None:
        m = self.m
        res, sc, mc, t0, timeout = a
        md = self._next_metadata()
        try:
            call = mc(self._request, timeout=timeout, metadata=md, credentials=self._credentials,
                      compression=self._compression)
        except BaseException:
            m.finish(res, sc, t0, _UNKNOWN)
            raise

        def finished(c: Any) -> None:
            status = status_now(c)
            m.finish(res, sc, t0, status[0] if status is not None else _UNKNOWN, c)

        call.add_done_callback(finished)
        att = _Attempt(call, sc)
        att.task = asyncio.get_running_loop().create_task(self._watch(att))
        self.live.append(att)

    async def _watch(self, att: _Attempt) -> None:
        q = self._q
        try:
            if self._stream:
                msg = await att.call.read()
                q.put_nowait((att, _END if msg is _EOF else _MSG, msg))
            else:
                q.put_nowait((att, _RESP, await att.call))
        except grpc.aio.AioRpcError as e:
            q.put_nowait((att, _ERR, e))
        except asyncio.CancelledError:
            pass  # cancelled by the race (another attempt committed, or the application cancelled the call)

    async def run(self) -> tuple[_Attempt, str, Any]:
        await self._first()
        while (wait := self._due()) is not True:
            try:
                ev = await asyncio.wait_for(self._q.get(), wait)
            except asyncio.TimeoutError:
                continue
            if self._ended(ev, ev[1] != _ERR):
                return ev
        assert self.last is not None
        return self.last

    def cancel(self) -> None:
        """The call was cancelled: no more hedges, every attempt cancelled."""
        self.plan.stop()
        for att in self.live:
            att.call.cancel()
        self.live.clear()


class _HedgedCall:
    """What the hedged grpc.aio call kinds share: a task runs the race; then the winning attempt answers for the
    call (its metadata, code, details), or the final error does."""

    def __init__(self, m: AioMethod, request: Any, timeout: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None, credentials: grpc.CallCredentials | None,
                 wait_for_ready: bool | None, compression: grpc.Compression | None, *, stream: bool) -> None:
        deadline, wfr = m.settings(timeout, wait_for_ready)
        self._m = m
        self._deadline = deadline
        self._race = AioRace(m, request, deadline, metadata, credentials, wfr, compression, stream=stream)
        self._call: Any = None  # the winning attempt's call
        self._error: grpc.aio.AioRpcError | None = None
        self._first: list[Any] = []  # a stream's first message, read by the race
        self._task = asyncio.get_running_loop().create_task(self._settle())

    async def _settle(self) -> Any:
        try:
            att, kind, payload = await self._race.run()
        except asyncio.CancelledError:
            self._race.cancel()
            raise
        except grpc.aio.AioRpcError as e:
            self._error = e
            raise
        self._call = att.call
        if kind == _ERR:
            self._error = self._m.explained_aio(payload, att.sc)
            raise self._error
        if kind == _MSG:
            self._first.append(payload)
        return payload

    async def _final(self) -> None:
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise
        except Exception:  # noqa: BLE001, S110  # the outcome is read from _error / the winning call
            pass

    async def code(self) -> grpc.StatusCode:
        await self._final()
        if self._task.cancelled():
            return _CANCELLED
        if self._error is not None:
            return self._error.code()
        return await self._call.code()  # type: ignore[no-any-return]

    async def details(self) -> str:
        await self._final()
        if self._task.cancelled():
            return "Locally cancelled by application!"
        if self._error is not None:
            return self._error.details() or ""
        return await self._call.details()  # type: ignore[no-any-return]

    async def initial_metadata(self) -> Any:
        await self._final()
        if self._call is None:
            return self._error.initial_metadata() if self._error is not None else grpc.aio.Metadata()
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        await self._final()
        if self._error is not None:
            return self._error.trailing_metadata()
        if self._call is None:
            return grpc.aio.Metadata()
        return await self._call.trailing_metadata()

    async def wait_for_connection(self) -> None:
        await self._final()

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._race.plan.m.clock())

    def cancel(self) -> bool:
        if not self._task.done():
            self._race.cancel()
            return self._task.cancel()
        return bool(self._call.cancel()) if self._call is not None else False

    def cancelled(self) -> bool:
        if self._task.cancelled():
            return True
        return self._call is not None and bool(self._call.cancelled())

    def done(self) -> bool:
        if not self._task.done():
            return False
        return self._call is None or bool(self._call.done())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        def after_race(_t: Any) -> None:
            if self._call is None:
                callback(self)
            else:
                self._call.add_done_callback(lambda _c: callback(self))

        self._task.add_done_callback(after_race)


class HedgedUnaryUnaryCall(_HedgedCall, grpc.aio.UnaryUnaryCall):  # type: ignore[misc]
    """A hedged unary-unary grpc.aio call: awaiting it awaits the race."""

    def __init__(self, m: AioMethod, request: Any, timeout: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None, credentials: grpc.CallCredentials | None,
                 wait_for_ready: bool | None, compression: grpc.Compression | None) -> None:
        super().__init__(m, request, timeout, metadata, credentials, wait_for_ready, compression, stream=False)

    def __await__(self) -> Any:
        return self._task.__await__()


class HedgedUnaryStreamCall(_HedgedCall, grpc.aio.UnaryStreamCall):  # type: ignore[misc]
    """A hedged unary-stream grpc.aio call: the first read awaits the race; then the winner's messages."""

    def __init__(self, m: AioMethod, request: Any, timeout: float | None,
                 metadata: CallMetadata | grpc.aio.Metadata | None, credentials: grpc.CallCredentials | None,
                 wait_for_ready: bool | None, compression: grpc.Compression | None) -> None:
        super().__init__(m, request, timeout, metadata, credentials, wait_for_ready, compression, stream=True)

    async def read(self) -> Any:
        try:
            await self._task
        except asyncio.CancelledError:
            self.cancel()
            raise
        if self._first:
            return self._first.pop()
        return await self._call.read()

    def __aiter__(self) -> AsyncIterator[Any]:
        return messages(self)
