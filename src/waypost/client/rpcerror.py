"""grpc.RpcError values raised by the balanced channel itself (before any backend saw the call)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc

from ..types import CallMetadata


class BalancerRpcError(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc]
    """A finished, failed call: what grpc raises for an inactive RPC, produced by the balancer.

    It is both the exception and the (completed) call/future, like grpc's own ``_InactiveRpcError``.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"<BalancerRpcError {code.name}: {details}>")
        self._code = code
        self._details = details

    def __str__(self) -> str:
        return f"<_InactiveRpcError of RPC that terminated with:\n\tstatus = {self._code}\n\tdetails = \"{self._details}\"\n>"

    # grpc.Call / RpcContext
    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> CallMetadata | None:
        return ()

    def trailing_metadata(self) -> CallMetadata | None:
        return ()

    def debug_error_string(self) -> str:
        return f"waypost: {self._code.name}: {self._details}"

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future
    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        return None

    def add_done_callback(self, fn: Any) -> None:
        fn(self)

    # streaming responses: iterating a failed stream raises at once
    def __iter__(self) -> BalancerRpcError:
        return self

    def __next__(self) -> Any:
        raise self


class ExplainedRpcError(BalancerRpcError):
    """A backend's failed call with fuller details (``client.explain``): the code, metadata and debug string of
    the ``original`` error, the original details first."""

    def __init__(self, original: grpc.RpcError, details: str) -> None:
        super().__init__(original.code(), details)  # type: ignore[attr-defined]
        self.original = original

    def initial_metadata(self) -> CallMetadata | None:
        return self.original.initial_metadata()  # type: ignore[attr-defined]

    def trailing_metadata(self) -> CallMetadata | None:
        return self.original.trailing_metadata()  # type: ignore[attr-defined]

    def debug_error_string(self) -> str:
        return str(self.original.debug_error_string())  # type: ignore[attr-defined]
