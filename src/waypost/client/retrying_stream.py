"""The sync retrying response stream: a response iterator that starts a new attempt while no message has been
received yet (unary_stream and stream_stream calls of ``waypost.dial``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc

from ..types import CallMetadata


class DelegatedCall(grpc.Call, grpc.Future):  # type: ignore[misc]
    """A response stream's grpc.Call / grpc.Future methods, delegated to the attempt in ``self._call`` (the retrying
    stream's current attempt, a hedged stream's winner); a subclass overrides what it must settle first."""

    _call: Any

    def initial_metadata(self) -> CallMetadata | None:
        return self._call.initial_metadata()

    def trailing_metadata(self) -> CallMetadata | None:
        return self._call.trailing_metadata()

    def code(self) -> grpc.StatusCode | None:
        return self._call.code()

    def details(self) -> str | None:
        return self._call.details()

    def is_active(self) -> bool:
        return bool(self._call.is_active())

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def add_callback(self, callback: Callable[[], None]) -> bool:
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

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        return self._call.traceback(timeout)

    def add_done_callback(self, fn: Any) -> None:
        self._call.add_done_callback(lambda _c: fn(self))

    def debug_error_string(self) -> Any:
        return self._call.debug_error_string()


class RetryingStream(DelegatedCall):
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

    # grpc.Call / grpc.Future: delegated to the current attempt (DelegatedCall); a cancel also stops the retries
    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())
