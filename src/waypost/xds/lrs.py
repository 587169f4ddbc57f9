"""Load reporting: ``envoy.service.load_stats.v3.LoadReportingService/StreamLoadStats`` (LRS, gRFC A27) on the ADS
server, and what it learns, for ``waypost xds status --load``, the console and Prometheus.

An export with ``load_reporting = true`` has its Cluster (and its subsets' Clusters) name this control plane as
the ``lrs_server`` (``ConfigSource`` ``self``: the server the client already talks ADS to), with
``lrs_report_endpoint_metrics`` asking for the backends' ORCA utilizations and every named metric (gRFC A85).
A gRPC client with such a cluster opens one LRS stream on its ADS connection:

1. the client sends its Node (and no stats);
2. the server answers once with ``send_all_clusters`` (and, for a client that does not know that flag, the names
   of the load-reporting clusters served now) and ``load_reporting_interval``;
3. from then on the client sends, every interval, the counts of that interval per cluster and locality
   (``load_stats.py`` sums them).

gRPC's clients count calls per locality only when they report load: grpc-java 1.85 enforces a Cluster's
``max_requests`` (circuit breaking, gRFC A32) only then, since its call counter comes with the per-locality
stats.

``waypost.xds.v1.LoadStatus/Fetch`` (unary; any request; the answer is ``LoadStats.view()`` as JSON) serves the
sums to ``waypost xds status --load`` and the console, on the same port and credentials.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.load_stats.v3 import lrs_pb2
from google.protobuf import duration_pb2

from .exports import Export, PrefixExport
from .load_stats import LoadStats

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("waypost.xds")

SERVICE = "envoy.service.load_stats.v3.LoadReportingService"
METHOD = "StreamLoadStats"
STATUS_SERVICE = "waypost.xds.v1.LoadStatus"
STATUS_METHOD = "Fetch"
#: the full method ``waypost xds status --load`` and the console call
STATUS_PATH = f"/{STATUS_SERVICE}/{STATUS_METHOD}"
#: seconds between two reports of a client, unless configured
DEFAULT_INTERVAL = 10.0
#: the Node client feature of a client that understands ``send_all_clusters``
SEND_ALL_FEATURE = "envoy.lrs.supports_send_all_clusters"


def check_interval(seconds: object, where: str = "load reporting interval") -> float:
    """``seconds`` as a float from 0.1 to 3600; ValueError naming ``where`` otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0.1 <= seconds <= 3600:
        raise ValueError(f"{where}: expected seconds from 0.1 to 3600, got {seconds!r}")
    return float(seconds)


def with_load_reporting(exports: Iterable[Export], prefixes: Iterable[PrefixExport]
                        ) -> tuple[list[Export], list[PrefixExport]]:
    """Every export, and every export found under the prefixes, with load reporting on (``--load-reporting``);
    one that sets ``load_reporting = false`` itself keeps it off."""
    out_prefixes = [p if "load_reporting" in p.options else replace(p, options={**p.options, "load_reporting": True})
                    for p in prefixes]
    return [e if e.load_reporting is not None else replace(e, load_reporting=True) for e in exports], out_prefixes


class LrsServer:
    """The LRS service over ``stats`` (module docstring). ``clusters()`` names the load-reporting clusters served
    now (for clients that do not understand ``send_all_clusters``)."""

    def __init__(self, stats: LoadStats, clusters: Callable[[], list[str]]) -> None:
        self.stats = stats
        self.clusters = clusters
        self._ids = itertools.count(1)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register LRS and the status method on a ``grpc.aio`` server."""
        stream = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=lrs_pb2.LoadStatsRequest.FromString,
            response_serializer=lrs_pb2.LoadStatsResponse.SerializeToString)
        fetch = grpc.unary_unary_rpc_method_handler(
            self._fetch, request_deserializer=lambda data: data,
            response_serializer=lambda view: json.dumps(view, sort_keys=True).encode())
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: stream}),
                                         grpc.method_handlers_generic_handler(STATUS_SERVICE, {STATUS_METHOD: fetch})))

    def response(self, node: Any) -> lrs_pb2.LoadStatsResponse:
        """The one answer a client gets: every cluster, reported every interval."""
        interval = duration_pb2.Duration()
        interval.FromNanoseconds(round(self.stats.interval * 1e9))
        out = lrs_pb2.LoadStatsResponse(send_all_clusters=True, load_reporting_interval=interval)
        if SEND_ALL_FEATURE not in node.client_features:
            out.clusters.extend(self.clusters())
        return out

    async def _fetch(self, _request: bytes, _context: grpc.aio.ServicerContext) -> dict[str, Any]:
        return self.stats.view()

    async def _stream(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        stream = next(self._ids)
        peer = context.peer()
        self.stats.opened(stream)
        who = peer
        try:
            first = await context.read()
            if first is grpc.aio.EOF:
                return
            if first.node.id:
                who = f"{first.node.id} ({peer})"
            log.info("xds: load reports from %s: every %gs", who, self.stats.interval)
            if first.cluster_stats:  # a client may start with stats (Envoy does): count them too
                self.stats.record(stream, first.cluster_stats)
            await context.write(self.response(first.node))
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                self.stats.record(stream, req.cluster_stats)
                log.debug("xds: load report from %s: %d cluster(s)", who, len(req.cluster_stats))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- the client went away (or sent garbage): end this stream only
            log.debug("xds: load reports of %s ended: %r", who, e)
        finally:
            self.stats.closed(stream)
            log.info("xds: load reports from %s ended", who)


class LoadCollector:
    """The ``waypost_xds_load_*`` Prometheus metrics, read from ``LoadStats`` at each scrape (``docs/xds.md``)."""

    def __init__(self, stats: LoadStats) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["export", "cluster", "locality"]
        calls = CounterMetricFamily("waypost_xds_load_calls", "Calls the xDS clients reported finished, by outcome "
                                    "(succeeded, errored)", labels=[*labels, "outcome"])
        issued = CounterMetricFamily("waypost_xds_load_issued", "Calls the xDS clients reported issued",
                                     labels=labels)
        in_flight = GaugeMetricFamily("waypost_xds_load_in_flight", "Calls in progress at the xDS clients, as of "
                                      "their last load reports", labels=labels)
        metric_calls = CounterMetricFamily("waypost_xds_load_metric_calls", "Calls whose backend reported the ORCA "
                                           "metric", labels=[*labels, "metric"])
        metric_sum = CounterMetricFamily("waypost_xds_load_metric_sum", "Sum of the ORCA metric's values over "
                                         "those calls", labels=[*labels, "metric"])
        dropped = CounterMetricFamily("waypost_xds_load_dropped", "Calls the xDS clients dropped (category "
                                      "'uncategorized': circuit breaking)", labels=["export", "cluster", "category"])
        for export, cluster, where, t, n in self.stats.samples():
            key = [export, cluster, where]
            calls.add_metric([*key, "succeeded"], t.succeeded)
            calls.add_metric([*key, "errored"], t.errored)
            issued.add_metric(key, t.issued)
            in_flight.add_metric(key, n)
            for name, m in t.metrics.items():
                metric_calls.add_metric([*key, name], m.count)
                metric_sum.add_metric([*key, name], m.total)
        for export, cluster, total, by_category in self.stats.drops():
            for category, n in by_category.items():
                dropped.add_metric([export, cluster, category], n)
            dropped.add_metric([export, cluster, "uncategorized"], total - sum(by_category.values()))
        reports = CounterMetricFamily("waypost_xds_load_reports", "Load reports received")
        reports.add_metric([], self.stats.reports)
        clients = GaugeMetricFamily("waypost_xds_load_clients", "LRS streams open")
        clients.add_metric([], self.stats.streams)
        yield from (calls, issued, in_flight, metric_calls, metric_sum, dropped, reports, clients)
