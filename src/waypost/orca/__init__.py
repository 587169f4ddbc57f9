"""A server's load reports, per call and out of band, and their parsing on the client: ORCA (gRFC A51/A58
``xds.data.orca.v3.OrcaLoadReport``) and waypost's own ``waypost.load.v1``, both built from one call accounting.

Server side (``waypost.serve`` mounts both by default: ``mount``; ``interceptor()`` for any grpcio server):

- per call: the ``endpoint-load-metrics-bin`` trailer, a serialized ``OrcaLoadReport`` (also sent as
  ``waypost-load-metrics-bin``: grpcio's C-core keeps gRPC's key from Python clients);
- out of band: ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics``, and waypost's
  ``waypost.load.v1.LoadReporter/Report`` (calls in flight, latency estimate: what ``prequal`` reads);
- the application's values: ``server_recorder(handle).set_application_utilization(0.4)`` and, inside a
  handler, ``call_recorder(context).set_request_cost("db", 3)``; ``set_load(value)`` for both reports.

waypost's own report alone: ``mount_waypost_report(server)``, ``load_interceptor(aio=False)`` (the accounting
interceptor, to pass to ``grpc.aio.server``), ``LoadAccount`` (what a server counts), ``report_stub(channel)``
(ask a server: ``stub(waypost_load_pb.ReportRequest(), timeout=...)``), ``waypost_load_pb`` (its messages).

Client side: ``parse_report(data)`` reads a trailer or a stream message into a ``LoadReport`` (or None, when
the bytes are not a valid report); ``weighted_round_robin`` (``waypost.balancer.weighted_round_robin``) reads them.

ORCA needs the ``xds-protos`` package (``pip install waypost[xds]``); without it servers report
``waypost.load.v1`` only and clients read no ORCA report (see ``available()``). ``waypost.load.v1`` depends on
grpcio and protobuf only.
"""

from __future__ import annotations

from ._generated import waypost_load_pb2 as waypost_load_pb
from ._protos import available, protos
from .account import LoadAccount, LoadSnapshot, set_load
from .load_interceptor import AsyncLoadInterceptor, LoadInterceptor, load_interceptor
from .mount import configure, interceptor, mount, mount_waypost_report, server_recorder
from .parse import LoadReport, parse_report
from .recorder import CallMetricsRecorder, ServerMetricsRecorder, call_recorder
from .reporter import MIRROR_KEY, TRAILER_KEY, OrcaReporter
from .server_interceptor import AsyncOrcaInterceptor, OrcaInterceptor
from .service import OOB_METHOD, SERVICE, OobService, oob_request
from .waypost_report import REPORT_METHOD, Reporter, report_stub

__all__ = [
    "MIRROR_KEY",
    "OOB_METHOD",
    "REPORT_METHOD",
    "SERVICE",
    "TRAILER_KEY",
    "AsyncLoadInterceptor",
    "AsyncOrcaInterceptor",
    "CallMetricsRecorder",
    "LoadAccount",
    "LoadInterceptor",
    "LoadReport",
    "LoadSnapshot",
    "OobService",
    "OrcaInterceptor",
    "OrcaReporter",
    "Reporter",
    "ServerMetricsRecorder",
    "available",
    "call_recorder",
    "configure",
    "interceptor",
    "load_interceptor",
    "mount",
    "mount_waypost_report",
    "oob_request",
    "parse_report",
    "protos",
    "report_stub",
    "server_recorder",
    "set_load",
    "waypost_load_pb",
]
