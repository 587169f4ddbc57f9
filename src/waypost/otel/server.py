"""The server's side of a trace: an interceptor that reads the trace context a client's attempt sent in its
metadata (OpenTelemetry's configured propagators) and runs the handler in a ``Recv.<service>.<method>`` span, a
child of that attempt's span. ``waypost.serve`` puts it first on a ``grpc.server`` while tracing is on
(``mount``); a ``grpc.aio.server`` takes interceptors only when created:
``grpc.aio.server(interceptors=[waypost.otel.server_interceptor(aio=True)])``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .._grpc_private import prepend_server_interceptor
from .client import rpc_attributes, span_name

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("waypost.otel")

_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler, False),
          ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
          ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
          ("stream_stream", grpc.stream_stream_rpc_method_handler, True))


#: where an interceptor's tracer comes from, asked at each call (``waypost.otel``'s, else the global provider's)
TracerSource = Callable[[], "Tracer"]


def _start(tracer: Tracer, details: grpc.HandlerCallDetails) -> AbstractContextManager[Span]:
    from opentelemetry import propagate, trace

    carrier = {k: v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
    return tracer.start_as_current_span(span_name("Recv", details.method), context=propagate.extract(carrier),
                                        kind=trace.SpanKind.SERVER, attributes=rpc_attributes(details.method))


def _wrapped(handler: Any, wrap: Callable[[Any, bool], Any]) -> Any:
    for kind, make, streaming in _KINDS:
        behavior = getattr(handler, kind, None)
        if behavior is not None:
            return make(wrap(behavior, streaming), request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return handler


class TraceInterceptor(grpc.ServerInterceptor):
    """``grpc.server``'s interceptor: each call's handler runs in a span joined to the client's trace."""

    def __init__(self, tracer: TracerSource) -> None:
        self.tracer = tracer

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        tracer = self.tracer()

        def wrap(behavior: Any, streaming: bool) -> Any:
            if streaming:
                def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                    with _start(tracer, details):
                        yield from behavior(request, context)
                return stream

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                with _start(tracer, details):
                    return behavior(request, context)
            return unary

        return _wrapped(handler, wrap)


class AsyncTraceInterceptor(grpc.aio.ServerInterceptor):
    """``grpc.aio.server``'s interceptor (pass it when creating the server)."""

    def __init__(self, tracer: TracerSource) -> None:
        self.tracer = tracer

    async def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        tracer = self.tracer()

        def wrap(behavior: Any, streaming: bool) -> Any:
            if streaming:
                async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                    with _start(tracer, details):
                        out = behavior(request, context)
                        if hasattr(out, "__aiter__"):
                            async for item in out:
                                yield item
                        else:  # a handler that writes with context.write() and returns
                            await out
                return stream

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with _start(tracer, details):
                    return await behavior(request, context)
            return unary

        return _wrapped(handler, wrap)


def mount(server: grpc.Server | grpc.aio.Server, tracer: TracerSource) -> None:
    """Put a ``TraceInterceptor`` first on ``server`` (a ``grpc.server``; one already there is kept). A
    ``grpc.aio.server`` cannot take one once created: said once at debug level."""
    if isinstance(server, grpc.aio.Server):
        log.debug("waypost.otel: %r is a grpc.aio.server: pass interceptors=[waypost.otel.server_interceptor("
                  "aio=True)] when creating it for server spans", server)
        return
    if prepend_server_interceptor(server, TraceInterceptor(tracer), keep=TraceInterceptor) is None:
        log.warning("waypost.otel: cannot add the trace interceptor to %r (unknown grpcio internals); pass "
                    "interceptors=[waypost.otel.server_interceptor()] to grpc.server()", server)
