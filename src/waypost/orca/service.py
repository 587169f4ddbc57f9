"""The out-of-band ORCA service, ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics``.

A client sends one ``OrcaLoadReportRequest`` and receives the server's report at once, then every
``report_interval`` until it cancels. The interval is raised to the server's floor, ``min_interval``
(``DEFAULT_MIN_INTERVAL``, 1 s, unless configured: grpc-go's server uses 30 s; 1 s keeps a client asking for
gRPC's default 10 s exactly at 10 s, and a report costs a few microseconds). An absent or zero interval means
the floor. xds-protos has no ``orca_pb2_grpc`` module: the method is registered by its path.

A sync ``grpc.server`` runs each open stream on one of its worker threads for the stream's life, sleeping
between reports: at most ``max_streams`` (``DEFAULT_MAX_STREAMS``) streams are served at once, later ones fail
with RESOURCE_EXHAUSTED so that reports never take every worker (size the pool for the clients that stream).
A ``grpc.aio.server`` sleeps on its event loop and has no such cost; the same cap applies.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from ._protos import protos
from .reporter import OrcaReporter

SERVICE = "xds.service.orca.v3.OpenRcaService"
OOB_METHOD = f"/{SERVICE}/StreamCoreMetrics"
DEFAULT_MIN_INTERVAL = 1.0
DEFAULT_MAX_STREAMS = 16


def _interval(request: Any, floor: float) -> float:
    d = request.report_interval
    asked = d.seconds + d.nanos / 1e9
    return max(asked, floor)


class OobService:
    """Serves StreamCoreMetrics from one ``OrcaReporter``."""

    def __init__(self, reporter: OrcaReporter, min_interval: float = DEFAULT_MIN_INTERVAL,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval!r}")
        self.reporter = reporter
        self.min_interval = min_interval
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self.open_streams = 0

    def _enter(self, context: grpc.ServicerContext | grpc.aio.ServicerContext) -> bool:
        with self._lock:
            if self.open_streams >= self.max_streams:
                return False
            self.open_streams += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self.open_streams -= 1

    def _stream(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        if not self._enter(context):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"ORCA: {self.max_streams} report streams are open on this server already")
        try:
            interval = _interval(request, self.min_interval)
            ended = threading.Event()
            context.add_callback(ended.set)
            while context.is_active():
                yield self.reporter.report().SerializeToString()
                if ended.wait(interval):
                    return
        finally:
            self._leave()

    async def _stream_async(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if not self._enter(context):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"ORCA: {self.max_streams} report streams are open on this server already")
        try:
            interval = _interval(request, self.min_interval)
            while True:
                yield self.reporter.report().SerializeToString()
                await asyncio.sleep(interval)
        finally:
            self._leave()

    def method_handler(self, aio: bool = False) -> grpc.RpcMethodHandler:
        loaded = protos()
        assert loaded is not None, "the ORCA service needs xds-protos"
        return grpc.unary_stream_rpc_method_handler(
            self._stream_async if aio else self._stream,
            request_deserializer=loaded[1].OrcaLoadReportRequest.FromString,
            response_serializer=None,  # the handler yields serialized reports
        )

    def generic_handler(self, aio: bool = False) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {"StreamCoreMetrics": self.method_handler(aio)})


def oob_request(interval: float) -> bytes:
    """A serialized ``OrcaLoadReportRequest`` asking for a report every ``interval`` seconds (xds-protos)."""
    loaded = protos()
    assert loaded is not None, "ORCA needs xds-protos"
    req = loaded[1].OrcaLoadReportRequest()
    req.report_interval.seconds = int(interval)
    req.report_interval.nanos = round((interval - int(interval)) * 1e9)
    return req.SerializeToString()  # type: ignore[no-any-return]
