"""Server load reports: a server tells clients how loaded it is (``waypost.load.v1.LoadReporter``).

- ``mount(server)``: what ``waypost.serve``/``serve_async`` call to add the service (and, for a
  ``grpc.server``, the accounting interceptor);
- ``load_interceptor(aio=False)``: the accounting interceptor, to pass to ``grpc.aio.server``;
- ``set_load(value)``: the application's own load value (number or callable) in every report;
- ``report_stub(channel)``: call the service (``stub(ReportRequest(), timeout=...)``);
- ``LoadAccount``: what a server counts; ``pb``: the messages (``LoadReport``, ``ReportRequest``).

Layering: depends on grpcio and protobuf only, so both servers and client-side policies may use it.
"""

from __future__ import annotations

from ._proto import waypost_load_pb2 as pb
from .account import LoadAccount, LoadSnapshot, set_load
from .interceptor import AsyncLoadInterceptor, LoadInterceptor, load_interceptor
from .mount import mount
from .service import REPORT_METHOD, SERVICE, Reporter, report_stub

__all__ = [
    "REPORT_METHOD",
    "SERVICE",
    "AsyncLoadInterceptor",
    "LoadAccount",
    "LoadInterceptor",
    "LoadSnapshot",
    "Reporter",
    "load_interceptor",
    "mount",
    "pb",
    "report_stub",
    "set_load",
]
