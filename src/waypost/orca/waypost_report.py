"""waypost's own load report, ``waypost.load.v1.LoadReporter/Report``: one O(1) reading per call.

The report carries what ORCA's does not: the server's calls in flight and its latency estimate at the current
load (the ``prequal`` policy picks on them). A ``Reporter`` turns a ``LoadAccount`` (or nothing, on a server
without the load interceptor: then only CPU and the application value are reported) into a ``LoadReport``
message. The method is registered by its path with grpcio's generic handlers, so no generated ``*_grpc`` stub is
needed; ``report_stub`` calls it the same way.
"""

from __future__ import annotations

from typing import Any

import grpc

from ._generated import waypost_load_pb2 as pb
from .account import CpuMeter, LoadAccount, application_value

SERVICE = "waypost.load.v1.LoadReporter"
REPORT_METHOD = f"/{SERVICE}/Report"


class Reporter:
    """Builds load reports from one server's account (None: the server does not account calls)."""

    def __init__(self, account: LoadAccount | None) -> None:
        self.account = account
        self._cpu = CpuMeter()

    def report(self) -> pb.LoadReport:
        msg = pb.LoadReport()
        if self.account is not None:
            snap = self.account.snapshot()
            msg.in_flight = snap.in_flight
            if snap.latency_estimate is not None:
                msg.latency_estimate_seconds = snap.latency_estimate
            msg.calls_completed = snap.calls_completed
            msg.calls_failed = snap.calls_failed
        cpu = self._cpu.read()
        if cpu is not None:
            msg.cpu_utilization = cpu
        app = application_value()
        if app is not None:
            msg.application_utilization = app
        return msg

    def method_handler(self, aio: bool = False) -> grpc.RpcMethodHandler:
        """The Report method's handler (a coroutine for grpc.aio servers)."""
        if aio:
            async def report_async(request: Any, context: grpc.aio.ServicerContext) -> pb.LoadReport:
                return self.report()

            behavior: Any = report_async
        else:
            def report(request: Any, context: grpc.ServicerContext) -> pb.LoadReport:
                return self.report()

            behavior = report
        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=pb.ReportRequest.FromString,
            response_serializer=pb.LoadReport.SerializeToString,
        )

    def generic_handler(self, aio: bool = False) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {"Report": self.method_handler(aio)})


def report_stub(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """A callable ``stub(ReportRequest(), timeout=...) -> LoadReport`` on ``channel`` (sync or aio)."""
    return channel.unary_unary(
        REPORT_METHOD,
        request_serializer=pb.ReportRequest.SerializeToString,
        response_deserializer=pb.LoadReport.FromString,
    )
