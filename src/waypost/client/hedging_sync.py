"""Hedged calls of ``waypost.dial`` (unary-unary and unary-stream methods with a ``hedgingPolicy``): the attempts
race, each on a backend of its own, until one commits (``hedging.HedgePlan`` decides when the next one goes).

A unary attempt is a grpc future; a stream attempt is a call whose first response (a message, or its end) is
awaited by a small thread. Attempts report to one queue; the caller's thread runs the race on it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from ..types import CallMetadata
from .hedging import RaceState
from .method import Attempt, BalancedChannel, MethodBase
from .retrying_stream import DelegatedCall

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_UNKNOWN = grpc.StatusCode.UNKNOWN

# what an attempt reports: a message came, the stream ended (OK, no message), the attempt is done (unary)
_MSG, _END, _DONE, _ERR = "msg", "end", "done", "err"


class _Attempt:
    __slots__ = ("call", "sc")

    def __init__(self, call: Any, sc: Any) -> None:
        self.call = call
        self.sc = sc


class SyncRace(RaceState):
    """The attempts of one hedged sync call. ``run`` blocks until one commits and returns (attempt, kind, payload):
    ``_MSG`` with the first message, ``_END``, ``_DONE`` (a unary future, OK or the final error) or ``_ERR`` (a
    stream's final error)."""

    def __init__(self, m: MethodBase[BalancedChannel], request: Any, deadline: float | None,
                 metadata: CallMetadata | None,
                 credentials: grpc.CallCredentials | None, wfr: bool | None,
                 compression: grpc.Compression | None, *, stream: bool) -> None:
        super().__init__(m, request, deadline, metadata, credentials, wfr, compression, stream)
        self.m: MethodBase[BalancedChannel] = m
        self._q: queue.SimpleQueue[tuple[_Attempt, str, Any]] = queue.SimpleQueue()
        self._launch(m.begin(metadata, deadline, self.tried, wfr, wait=True))

    def _launch(self, a: Attempt) -> None:
        m = self.m
        res, sc, mc, t0, timeout = a
        md = self._next_metadata()
        q = self._q
        try:
            if self._stream:
                call = mc(self._request, timeout, md, self._credentials, None, self._compression)
            else:
                call = mc.future(self._request, timeout, md, self._credentials, None, self._compression)
        except BaseException:
            m.finish(res, sc, t0, _UNKNOWN)
            raise
        att = _Attempt(call, sc)
        self.live.append(att)
        if self._stream:
            call.add_done_callback(lambda c: m.finish(res, sc, t0, c.code(), c))
            threading.Thread(target=_read_first, args=(att, q), daemon=True, name="waypost-hedge").start()
        else:
            def done(f: Any) -> None:
                m.finish(res, sc, t0, f.code(), f)
                q.put((att, _DONE, f))

            call.add_done_callback(done)

    def run(self) -> tuple[_Attempt, str, Any]:
        while (wait := self._due()) is not True:
            try:
                ev = self._q.get(timeout=wait)
            except queue.Empty:
                continue
            if self._ended(ev, ev[1] in (_MSG, _END) or (ev[1] == _DONE and ev[2].code() is _OK)):
                return ev
        assert self.last is not None
        return self.last

    def cancel(self) -> None:
        """The application cancelled the call: no more hedges, every attempt cancelled."""
        self.plan.stop()
        for att in list(self.live):
            att.call.cancel()


def _read_first(att: _Attempt, q: queue.SimpleQueue[tuple[_Attempt, str, Any]]) -> None:
    """A stream attempt's first response: a message, its end, or its error."""
    try:
        msg = next(att.call)
    except StopIteration:
        q.put((att, _END, None))
    except grpc.RpcError as e:
        q.put((att, _ERR, e))
    except BaseException as e:  # noqa: BLE001  # a deserializer failed: reported as the attempt's error
        q.put((att, _ERR, _LocalError(e)))
    else:
        q.put((att, _MSG, msg))


class _LocalError(grpc.RpcError):  # type: ignore[misc]
    """A stream attempt that failed in the client (not with a status from the server): fatal, raised as is."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error

    def code(self) -> grpc.StatusCode:
        return _UNKNOWN

    def details(self) -> str:
        return str(self.error)

    def trailing_metadata(self) -> CallMetadata | None:
        return ()


def hedged_with_call(m: MethodBase[BalancedChannel], request: Any, deadline: float | None,
                     metadata: CallMetadata | None,
                     credentials: grpc.CallCredentials | None, wfr: bool | None,
                     compression: grpc.Compression | None) -> tuple[Any, grpc.Call]:
    """A hedged unary-unary call: (response, the winning attempt's call), or the final error raised."""
    race = SyncRace(m, request, deadline, metadata, credentials, wfr, compression, stream=False)
    att, _kind, fut = race.run()
    if fut.code() is _OK:
        return fut.result(), fut
    explained = m.explained(fut, att.sc)
    if explained is fut:
        raise fut
    raise explained from None


class HedgedStream(DelegatedCall):
    """The response iterator of a hedged unary-stream call: the race runs at the first ``next``; then the winning
    attempt's messages (its first one kept from the race)."""

    def __init__(self, race: SyncRace) -> None:
        self._race = race
        self._call: Any = race.live[0].call
        self._first: list[Any] = []
        self._error: BaseException | None = None
        self._done = False
        self._lock = threading.Lock()

    def _settle(self) -> None:
        with self._lock:
            if self._done:
                return
            att, kind, payload = self._race.run()
            self._call = att.call
            if kind == _MSG:
                self._first.append(payload)
            elif kind == _ERR:
                self._error = payload.error if isinstance(payload, _LocalError) else \
                    self._race.m.explained(payload, att.sc)
            self._done = True

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self._done:
            self._settle()
        if self._first:
            return self._first.pop()
        if self._error is not None:
            raise self._error
        return next(self._call)

    # grpc.Call / grpc.Future: the winning attempt's (before the race ends: the first attempt's)
    def initial_metadata(self) -> CallMetadata | None:
        self._settle()
        return self._call.initial_metadata()

    def trailing_metadata(self) -> CallMetadata | None:
        self._settle()
        return self._call.trailing_metadata()

    def code(self) -> grpc.StatusCode | None:
        self._settle()
        return self._call.code()

    def details(self) -> str | None:
        self._settle()
        return self._call.details()

    def cancel(self) -> bool:
        if not self._done:
            self._race.cancel()
            return True
        return bool(self._call.cancel())

def hedged_stream(m: MethodBase[BalancedChannel], request: Any, deadline: float | None,
                  metadata: CallMetadata | None,
                  credentials: grpc.CallCredentials | None, wfr: bool | None,
                  compression: grpc.Compression | None) -> HedgedStream:
    """A hedged unary-stream call: its first attempt starts now; the race runs when the stream is first read."""
    return HedgedStream(SyncRace(m, request, deadline, metadata, credentials, wfr, compression, stream=True))

