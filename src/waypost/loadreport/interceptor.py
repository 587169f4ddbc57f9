"""The load interceptor: counts every call a server handles and answers its load reports.

``LoadInterceptor`` (``grpc.server``) and ``AsyncLoadInterceptor`` (``grpc.aio.server``) each own a
``LoadAccount``. For every call they wrap the method's handler so that the account sees the call start
and end (streams: until the response iterator is exhausted or closed), and they answer
``waypost.load.v1.LoadReporter/Report`` themselves from that account, before any interceptor placed
after them (load reports carry no application data).

Cost: wrapped handlers are built once per method handler object and cached (grpcio hands out the
same handler object for a method on every call), so a call pays one dict lookup, two clock reads
and two short lock holds (measured by bench/server_load_cost.py).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc

from .account import LoadAccount
from .service import REPORT_METHOD, UNACCOUNTED_PREFIXES, Reporter

log = logging.getLogger("waypost.loadreport")

MAX_CACHED = 4096  # distinct handler objects remembered (a server has one per method)
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class _Wrapper:
    """Wraps method handlers for accounting, once per handler object."""

    def __init__(self, account: LoadAccount) -> None:
        self.account = account
        self._cache: dict[int, tuple[Any, Any]] = {}

    def __call__(self, handler: Any, method: str) -> Any:
        # checked per call, not cached: one handler object may serve several methods
        if handler is None or method.startswith(UNACCOUNTED_PREFIXES):
            return handler
        entry = self._cache.get(id(handler))
        if entry is not None and entry[0] is handler:
            return entry[1]
        wrapped = self._wrap(handler, method)
        if len(self._cache) < MAX_CACHED:
            self._cache[id(handler)] = (handler, wrapped)  # keeps handler alive: its id stays unique
        return wrapped

    def _wrap(self, handler: Any, method: str) -> Any:
        replace = getattr(handler, "_replace", None)  # grpcio's handlers are named tuples
        if replace is None:
            log.debug("load accounting skips %s: handler %r is not grpcio's RpcMethodHandler", method, handler)
            return handler
        for kind in _KINDS:
            behavior = getattr(handler, kind, None)
            if behavior is not None:
                return replace(**{kind: _counted(behavior, kind.endswith("stream"), self.account)})
        return handler


def _counted(behavior: Callable[..., Any], streaming_response: bool, account: LoadAccount) -> Callable[..., Any]:
    """``behavior`` with the call counted in ``account``; keeps its kind (plain, coroutine, generators)."""
    begin, end = account.begin, account.end
    if inspect.isasyncgenfunction(behavior):
        async def counted_agen(request: Any, context: Any) -> AsyncIterator[Any]:
            token = begin()
            failed = True
            try:
                async for item in behavior(request, context):
                    yield item
                failed = False
            finally:
                end(token, failed)

        return counted_agen
    if inspect.iscoroutinefunction(behavior):
        async def counted_coro(request: Any, context: Any) -> Any:
            token = begin()
            try:
                result = await behavior(request, context)
            except BaseException:
                end(token, True)
                raise
            end(token)
            return result

        return counted_coro
    if streaming_response:
        def counted_stream(request: Any, context: Any) -> Any:
            token = begin()
            try:
                responses = behavior(request, context)
            except BaseException:
                end(token, True)
                raise
            if hasattr(responses, "__anext__"):  # an aio handler returning an async iterator
                return _aiter_counted(responses, token, end)
            return _iter_counted(responses, token, end)

        return counted_stream

    def counted(request: Any, context: Any) -> Any:
        token = begin()
        try:
            result = behavior(request, context)
        except BaseException:
            end(token, True)
            raise
        end(token)
        return result

    return counted


def _iter_counted(responses: Iterator[Any], token: Any, end: Callable[..., None]) -> Iterator[Any]:
    failed = True
    try:
        yield from responses
        failed = False
    finally:  # also when grpcio closes the generator (the client cancelled)
        end(token, failed)


async def _aiter_counted(responses: AsyncIterator[Any], token: Any, end: Callable[..., None]) -> AsyncIterator[Any]:
    failed = True
    try:
        async for item in responses:
            yield item
        failed = False
    finally:
        end(token, failed)


class LoadInterceptor(grpc.ServerInterceptor):
    """Accounts a ``grpc.server``'s calls and answers its load reports (see the module doc)."""

    def __init__(self, account: LoadAccount | None = None) -> None:
        self.account = account if account is not None else LoadAccount()
        self.reporter = Reporter(self.account)
        self._report = self.reporter.method_handler(aio=False)
        self._wrap = _Wrapper(self.account)

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method == REPORT_METHOD:
            return self._report
        return self._wrap(continuation(handler_call_details), method)


class AsyncLoadInterceptor(grpc.aio.ServerInterceptor):
    """``LoadInterceptor`` for a ``grpc.aio.server`` (pass it in ``interceptors=`` when creating it)."""

    def __init__(self, account: LoadAccount | None = None) -> None:
        self.account = account if account is not None else LoadAccount()
        self.reporter = Reporter(self.account)
        self._report = self.reporter.method_handler(aio=True)
        self._wrap = _Wrapper(self.account)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method == REPORT_METHOD:
            return self._report
        return self._wrap(await continuation(handler_call_details), method)


def load_interceptor(aio: bool = False) -> LoadInterceptor | AsyncLoadInterceptor:
    """A new load interceptor for a ``grpc.server`` (or, with ``aio=True``, a ``grpc.aio.server``).

    ``waypost.serve`` adds one to a ``grpc.server`` by itself; a ``grpc.aio.server`` cannot get
    interceptors after it is created, so create it with
    ``grpc.aio.server(interceptors=[waypost.load_interceptor(aio=True)])`` to report its calls.
    """
    return AsyncLoadInterceptor() if aio else LoadInterceptor()
