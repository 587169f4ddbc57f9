"""ORCA load reports (gRFC A51/A58 ``xds.data.orca.v3.OrcaLoadReport``) from waypost servers, and their parsing.

Server side (``waypost.serve`` mounts it by default; ``interceptor()`` for any grpcio server):

- per call: the ``endpoint-load-metrics-bin`` trailer, a serialized ``OrcaLoadReport`` (also sent as
  ``waypost-load-metrics-bin``: grpcio's C-core keeps gRPC's key from Python clients);
- out of band: ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics``;
- the application's values: ``server_recorder(handle).set_application_utilization(0.4)`` and, inside a
  handler, ``call_recorder(context).set_request_cost("db", 3)``.

Client side: ``parse_report(data)`` reads a trailer or a stream message into a ``LoadReport`` (or None, when
the bytes are not a valid report); ``weighted_round_robin`` (``waypost.balancer.orca_wrr``) reads them.

Needs the ``xds-protos`` package (``pip install waypost[xds]``); without it servers report ``waypost.load.v1``
only and clients read no ORCA report (see ``available()``).
"""

from __future__ import annotations

from ._protos import available, protos
from .mount import configure, interceptor, mount, server_recorder
from .parse import LoadReport, parse_report
from .recorder import CallMetricsRecorder, ServerMetricsRecorder, call_recorder
from .reporter import MIRROR_KEY, TRAILER_KEY, OrcaReporter
from .server_interceptor import AsyncOrcaInterceptor, OrcaInterceptor
from .service import OOB_METHOD, SERVICE, OobService, oob_request

__all__ = [
    "MIRROR_KEY",
    "OOB_METHOD",
    "SERVICE",
    "TRAILER_KEY",
    "AsyncOrcaInterceptor",
    "CallMetricsRecorder",
    "LoadReport",
    "OobService",
    "OrcaInterceptor",
    "OrcaReporter",
    "ServerMetricsRecorder",
    "available",
    "call_recorder",
    "configure",
    "interceptor",
    "mount",
    "oob_request",
    "parse_report",
    "protos",
    "server_recorder",
]
