"""Wrapping a server's method handlers so that each call is accounted from its start to its end.

``HandlerWrapper`` is what both load interceptors (``load_interceptor``: waypost's own reports; ``server_interceptor``:
ORCA on top) put around the handlers grpcio gives them. Each call of a wrapped handler runs inside a
``CountedCall`` (or the ORCA interceptor's subclass, which also gives the call its recorder and its trailer), made by
the wrapper's ``start_call`` when the handler starts and told how it ended:

- ``raised()``: the handler itself raised (its error status is the call's answer): a failed call;
- ``end(failed)``: its result is returned, or its response stream is exhausted (``failed=False``), raised or was
  closed (grpcio closes it when the client cancels);
- ``detach()`` / ``attach()``: between a response stream's creation and its iteration, which grpcio may run in
  another context.

Every behaviour kind keeps its kind: plain function, coroutine, generator, async generator (and a sync-looking
handler returning an async iterator, as grpc.aio allows).

Cost: wrapped handlers are built once per method handler object and cached (grpcio hands out the same handler
object for a method on every call), so a call pays one dict lookup, the call object and what it counts
(``LoadAccount.begin``/``end``: two clock reads and two short lock holds; measured by bench/server_load_cost.py).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import call_load
from .account import LoadAccount
from .service import SERVICE as ORCA_SERVICE
from .waypost_report import REPORT_METHOD

if TYPE_CHECKING:
    import grpc
    import grpc.aio

log = logging.getLogger("waypost.orca")

MAX_CACHED = 4096  # distinct handler objects remembered (a server has one per method)
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

#: calls that say nothing about the application's load: never accounted (a health Watch stays open for
#: the life of the channel and would count as a call in flight forever)
UNACCOUNTED_PREFIXES = (REPORT_METHOD, "/grpc.health.v1.Health/", "/grpc.reflection.", f"/{ORCA_SERVICE}/")


class CountedCall:
    """One call in a ``LoadAccount``, from the start of its handler to its end (see the module doc)."""

    __slots__ = ("_account", "_context", "_token")

    def __init__(self, account: LoadAccount,
                 context: grpc.ServicerContext | grpc.aio.ServicerContext) -> None:
        self._account = account
        self._context = context
        self._token = account.begin()

    def raised(self) -> None:
        """The handler raised: the call failed, and its error status is all it answers."""
        self._account.end(self._token, True)

    def end(self, failed: bool) -> None:
        """The call's result was returned, or its response stream ended (``failed``: it raised or was closed).
        Its trailing metadata gets the server's load now (``call_load``), after any the handler set."""
        self._account.end(self._token, failed)
        add_trailers(self._context, self.load_trailer())

    def load_trailer(self) -> tuple[tuple[str, str], ...]:
        """The ``call_load`` trailer: the server's requests in flight and latency estimate now."""
        account = self._account
        in_flight = account.in_flight  # an int read is atomic: no lock (the estimate takes it once)
        return ((call_load.KEY, call_load.encode(in_flight, account.latency_estimate(in_flight))),)

    def detach(self) -> None:
        """The handler returned its response stream; the call goes on when the stream is iterated."""

    def attach(self) -> None:
        """The response stream is being iterated."""


def add_trailers(context: grpc.ServicerContext | grpc.aio.ServicerContext,
                 md: tuple[tuple[str, Any], ...]) -> None:
    """Append ``md`` to the call's trailing metadata (after any the handler set); a report must never fail the call
    it rides on."""
    try:
        existing = context.trailing_metadata()
        context.set_trailing_metadata(tuple(existing) + md if existing else md)
    except Exception:
        log.debug("load trailer: not added to this call", exc_info=True)


#: starts the accounting of one call, given the handler's context
StartCall = Callable[[Any], CountedCall]


class HandlerWrapper:
    """Wraps method handlers so that every call runs in a call made by ``start_call``; once per handler object."""

    def __init__(self, start_call: StartCall) -> None:
        self.start_call = start_call
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
            log.debug("load reports skip %s: handler %r is not grpcio's RpcMethodHandler", method, handler)
            return handler
        for kind in _KINDS:
            behavior = getattr(handler, kind, None)
            if behavior is not None:
                return replace(**{kind: accounted(behavior, kind.endswith("stream"), self.start_call)})
        return handler


def accounted(behavior: Callable[..., Any], streaming_response: bool, start_call: StartCall) -> Callable[..., Any]:
    """``behavior`` with each of its calls run in ``start_call(context)``; keeps its kind (see the module doc)."""
    if inspect.isasyncgenfunction(behavior):
        async def accounted_agen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call = start_call(context)
            failed = True
            try:
                async for item in behavior(request, context):
                    yield item
                failed = False
            finally:
                call.end(failed)

        return accounted_agen
    if inspect.iscoroutinefunction(behavior):
        async def accounted_coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = start_call(context)
            try:
                result = await behavior(request, context)
            except BaseException:
                call.raised()
                raise
            call.end(False)
            return result

        return accounted_coro
    if streaming_response:
        def accounted_stream(request: Any, context: grpc.ServicerContext) -> Any:
            call = start_call(context)
            responses = _run(behavior, request, context, call)
            call.detach()
            if hasattr(responses, "__anext__"):  # an aio handler returning an async iterator
                return _aiter_accounted(responses, call)
            return _iter_accounted(responses, call)

        return accounted_stream

    def accounted_unary(request: Any, context: grpc.ServicerContext) -> Any:
        call = start_call(context)
        result = _run(behavior, request, context, call)
        call.end(False)
        return result

    return accounted_unary


def _run(behavior: Callable[..., Any], request: Any, context: grpc.ServicerContext | grpc.aio.ServicerContext,
         call: CountedCall) -> Any:
    """``behavior(request, context)``, the call ended as raised when it raises."""
    try:
        return behavior(request, context)
    except BaseException:
        call.raised()
        raise


def _iter_accounted(responses: Iterator[Any], call: CountedCall) -> Iterator[Any]:
    call.attach()
    failed = True
    try:
        yield from responses
        failed = False
    finally:  # also when grpcio closes the generator (the client cancelled)
        call.end(failed)


async def _aiter_accounted(responses: AsyncIterator[Any], call: CountedCall) -> AsyncIterator[Any]:
    call.attach()
    failed = True
    try:
        async for item in responses:
            yield item
        failed = False
    finally:
        call.end(failed)
