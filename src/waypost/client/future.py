"""A ``grpc.Future`` for sync calls that must wait for a backend or retry: the blocking call runs on a worker.

grpcio's own futures belong to one attempt on one backend; a balanced call may wait for a READY backend and
make several attempts, so ``future()`` on such a call runs the blocking path on a small shared pool.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc

from ..types import CallMetadata

_executor_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _get_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="waypost-future")
        return _executor


class ThreadFuture(grpc.Future, grpc.Call):  # type: ignore[misc]
    """A grpc.Future for calls that must wait for a backend or retry: the blocking call runs on a worker."""

    def __init__(self, fn: Callable[..., tuple[Any, grpc.Call]], *args: Any) -> None:
        # in the caller's context: its hash key (client.hashkey) and its current span go along
        self._fut = _get_executor().submit(contextvars.copy_context().run, fn, *args)
        self._cancelled = False

    def _call(self) -> Any:
        try:
            return self._fut.result()[1]
        except grpc.RpcError as e:
            return e

    def cancel(self) -> bool:
        self._cancelled = self._fut.cancel()
        return self._cancelled

    def cancelled(self) -> bool:
        return self._fut.cancelled()

    def running(self) -> bool:
        return self._fut.running()

    def done(self) -> bool:
        return self._fut.done()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._fut.result(timeout)[0]
        except concurrent.futures.TimeoutError:
            raise grpc.FutureTimeoutError() from None
        except concurrent.futures.CancelledError:
            raise grpc.FutureCancelledError() from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return self._fut.exception(timeout)
        except concurrent.futures.TimeoutError:
            raise grpc.FutureTimeoutError() from None
        except concurrent.futures.CancelledError:
            raise grpc.FutureCancelledError() from None

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        exc = self.exception(timeout)
        return exc.__traceback__ if exc is not None else None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._fut.add_done_callback(lambda _f: fn(self))

    def initial_metadata(self) -> CallMetadata | None:
        return self._call().initial_metadata()

    def trailing_metadata(self) -> CallMetadata | None:
        return self._call().trailing_metadata()

    def code(self) -> grpc.StatusCode:
        return self._call().code()  # type: ignore[no-any-return]

    def details(self) -> str:
        return self._call().details()  # type: ignore[no-any-return]

    def is_active(self) -> bool:
        return not self._fut.done()

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._fut.add_done_callback(lambda _f: callback())
        return True
