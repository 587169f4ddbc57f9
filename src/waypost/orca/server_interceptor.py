"""The ORCA interceptor: waypost's load interceptor (calls in flight, latency, ``waypost.load.v1`` reports)
plus ORCA: the ``endpoint-load-metrics-bin`` trailer on each call (``per_call``) and the out-of-band
``StreamCoreMetrics`` service, answered by the interceptor itself.

``OrcaInterceptor`` is for ``grpc.server``, ``AsyncOrcaInterceptor`` for ``grpc.aio.server``; ``interceptor()``
makes either. Each handler is wrapped once (cached per handler object, as the load interceptor does); a call
then pays the load accounting, a context variable set and reset (where ``call_recorder`` finds the call) and,
with ``per_call``, one cached report added to the call's trailing metadata, after any the handler set, under two
keys: ``endpoint-load-metrics-bin`` (gRPC's: grpc-go, grpc-java and C-core policies read it) and
``waypost-load-metrics-bin`` (the same bytes). grpcio's C-core consumes gRPC's key on the client and never hands
it to Python code, so waypost's own Python client reads the second one.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ..loadreport.account import LoadAccount
from ..loadreport.interceptor import AsyncLoadInterceptor, LoadInterceptor, _Wrapper
from ..loadreport.service import REPORT_METHOD
from .recorder import ServerMetricsRecorder, _Slot, current_slot
from .reporter import OrcaReporter
from .service import DEFAULT_MAX_STREAMS, DEFAULT_MIN_INTERVAL, OOB_METHOD, OobService

log = logging.getLogger("waypost.orca")

_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _add_trailer(context: Any, reporter: OrcaReporter, slot: _Slot) -> None:
    try:
        md = reporter.trailer_metadata(slot.recorder)
        existing = context.trailing_metadata()
        context.set_trailing_metadata(tuple(existing) + md if existing else md)
    except Exception:  # a report must never fail the call it rides on
        log.debug("ORCA: no trailer for this call", exc_info=True)


class _OrcaWrapper(_Wrapper):
    def __init__(self, account: LoadAccount, reporter: OrcaReporter, per_call: bool) -> None:
        super().__init__(account)
        self.reporter = reporter
        self.per_call = per_call

    def _wrap(self, handler: Any, method: str) -> Any:
        replace = getattr(handler, "_replace", None)
        if replace is None:
            log.debug("ORCA skips %s: handler %r is not grpcio's RpcMethodHandler", method, handler)
            return handler
        for kind in _KINDS:
            behavior = getattr(handler, kind, None)
            if behavior is not None:
                return replace(**{kind: _reported(behavior, kind.endswith("stream"), self.account,
                                                  self.reporter if self.per_call else None)})
        return handler


def _reported(behavior: Callable[..., Any], streaming: bool, account: LoadAccount,
              reporter: OrcaReporter | None) -> Callable[..., Any]:
    """``behavior`` counted in ``account``, with a call recorder in context and (``reporter``) the trailer."""
    begin, end, var = account.begin, account.end, current_slot
    if inspect.isasyncgenfunction(behavior):
        async def reported_agen(request: Any, context: Any) -> AsyncIterator[Any]:
            token = begin()
            slot = _Slot()
            ctx = var.set(slot)
            failed = True
            try:
                async for item in behavior(request, context):
                    yield item
                failed = False
            finally:
                if reporter is not None:
                    _add_trailer(context, reporter, slot)
                var.reset(ctx)
                end(token, failed)

        return reported_agen
    if inspect.iscoroutinefunction(behavior):
        async def reported_coro(request: Any, context: Any) -> Any:
            token = begin()
            slot = _Slot()
            ctx = var.set(slot)
            try:
                result = await behavior(request, context)
            except BaseException:
                var.reset(ctx)
                end(token, True)
                raise
            if reporter is not None:
                _add_trailer(context, reporter, slot)
            var.reset(ctx)
            end(token)
            return result

        return reported_coro
    if streaming:
        def reported_stream(request: Any, context: Any) -> Any:
            token = begin()
            slot = _Slot()
            ctx = var.set(slot)
            try:
                responses = behavior(request, context)
            except BaseException:
                var.reset(ctx)
                end(token, True)
                raise
            var.reset(ctx)
            if hasattr(responses, "__anext__"):
                return _aiter_reported(responses, token, end, slot, context, reporter)
            return _iter_reported(responses, token, end, slot, context, reporter)

        return reported_stream

    def reported(request: Any, context: Any) -> Any:
        token = begin()
        slot = _Slot()
        ctx = var.set(slot)
        try:
            result = behavior(request, context)
        except BaseException:
            var.reset(ctx)
            end(token, True)
            raise
        if reporter is not None:
            _add_trailer(context, reporter, slot)
        var.reset(ctx)
        end(token)
        return result

    return reported


def _iter_reported(responses: Iterator[Any], token: Any, end: Callable[..., None], slot: _Slot, context: Any,
                   reporter: OrcaReporter | None) -> Iterator[Any]:
    failed = True
    ctx = current_slot.set(slot)
    try:
        yield from responses
        failed = False
    finally:
        if reporter is not None:
            _add_trailer(context, reporter, slot)
        try:
            current_slot.reset(ctx)
        except ValueError:  # closed from another context (grpcio cancelling the stream)
            pass
        end(token, failed)


async def _aiter_reported(responses: Any, token: Any, end: Callable[..., None], slot: _Slot, context: Any,
                          reporter: OrcaReporter | None) -> AsyncIterator[Any]:
    failed = True
    ctx = current_slot.set(slot)
    try:
        async for item in responses:
            yield item
        failed = False
    finally:
        if reporter is not None:
            _add_trailer(context, reporter, slot)
        try:
            current_slot.reset(ctx)
        except ValueError:
            pass
        end(token, failed)


def _add_orca(interceptor: Any, recorder: ServerMetricsRecorder | None, per_call: bool, min_interval: float,
              max_streams: int, *, aio: bool) -> None:
    """What both interceptors add to the load accounting: the ORCA reporter, its recorder, the OOB service and
    the handler wrapper that writes the per-call trailer."""
    interceptor.orca = OrcaReporter(interceptor.account, recorder)
    interceptor.recorder = interceptor.orca.recorder
    interceptor.oob = OobService(interceptor.orca, min_interval, max_streams)
    interceptor._oob_handler = interceptor.oob.method_handler(aio=aio)
    interceptor._wrap = _OrcaWrapper(interceptor.account, interceptor.orca, per_call)


class OrcaInterceptor(LoadInterceptor):
    """Load accounting, ``waypost.load.v1`` reports and ORCA for a ``grpc.server`` (see the module doc)."""

    orca: OrcaReporter
    recorder: ServerMetricsRecorder
    oob: OobService

    def __init__(self, account: LoadAccount | None = None, recorder: ServerMetricsRecorder | None = None, *,
                 per_call: bool = True, min_interval: float = DEFAULT_MIN_INTERVAL,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        super().__init__(account)
        _add_orca(self, recorder, per_call, min_interval, max_streams, aio=False)

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method == OOB_METHOD:
            return self._oob_handler
        if method == REPORT_METHOD:
            return self._report
        return self._wrap(continuation(handler_call_details), method)


class AsyncOrcaInterceptor(AsyncLoadInterceptor):
    """``OrcaInterceptor`` for a ``grpc.aio.server`` (pass it in ``interceptors=`` when creating the server)."""

    orca: OrcaReporter
    recorder: ServerMetricsRecorder
    oob: OobService

    def __init__(self, account: LoadAccount | None = None, recorder: ServerMetricsRecorder | None = None, *,
                 per_call: bool = True, min_interval: float = DEFAULT_MIN_INTERVAL,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        super().__init__(account)
        _add_orca(self, recorder, per_call, min_interval, max_streams, aio=True)

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method == OOB_METHOD:
            return self._oob_handler
        if method == REPORT_METHOD:
            return self._report
        return self._wrap(await continuation(handler_call_details), method)
