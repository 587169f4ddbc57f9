"""What gRPC's xDS clients report over LRS (``lrs.py``), summed over every client, per cluster and locality.

A client's ``LoadStatsRequest`` carries, per cluster it reports (the clusters whose Cluster names this control
plane as its ``lrs_server``), per locality of the endpoints it called: the calls that succeeded, errored and were
issued *since its last report*, the calls in progress *now*, and the ORCA metrics its backends returned (gRFC A64 /
A85: ``load_metric_stats`` name -> calls that carried it, sum of its values; cpu, memory and application
utilization as the names ``cpu_utilization``, ``mem_utilization``, ``application_utilization``); per cluster, the
calls it dropped (circuit breaking counts as an uncategorized drop; ``drop_overloads`` by category) and the length
of the interval the report covers.

``LoadStats`` keeps:

- **totals** since the control plane started, per (cluster, locality): succeeded, errored, issued, and per metric
  (count, sum); per cluster: dropped, and dropped per category. They only grow (Prometheus counters);
- **the last report of each client** (LRS stream): its counts divided by its interval are the client's rates, and
  its in-progress count is what the client has in flight. A client that reports no locality (or no cluster) any
  more reports nothing in flight there; a client whose stream ends is forgotten. Summed over the clients, that is
  the view ``waypost xds status --load`` and the console show (``view``).

Reports come in on the ADS server's event loop; a Prometheus scrape reads from its own thread, so the tables
are changed and read under one lock (held for a report's arithmetic, never across an await).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: ORCA's unnamed utilizations of a locality's stats, recorded as metrics of these names (gRFC A85)
UNNAMED_METRICS = ("cpu_utilization", "mem_utilization", "application_utilization")
#: what a load-reporting Cluster asks its clients to copy from the backends' ORCA reports (gRFC A85)
REPORTED_ORCA = (*UNNAMED_METRICS, "named_metrics.*")


def locality_text(locality: Any) -> str:
    """``region/zone/sub_zone`` without its empty trailing parts (``r1/a``; a zone without region: ``/a``); ``-``
    for the empty locality (the endpoints without region and zone)."""
    return f"{locality.region}/{locality.zone}/{locality.sub_zone}".rstrip("/") or "-"


@dataclass
class Metric:
    """One ORCA metric over calls: how many calls carried it and the sum of its values."""

    count: int = 0
    total: float = 0.0

    def add(self, count: int, total: float) -> None:
        self.count += count
        self.total += total


@dataclass
class LocalityTotals:
    """One (cluster, locality) since the start: calls succeeded, errored, issued; ORCA metrics by name."""

    succeeded: int = 0
    errored: int = 0
    issued: int = 0
    metrics: dict[str, Metric] = field(default_factory=dict)


@dataclass
class ClusterTotals:
    """One cluster since the start: the export it belongs to, its localities, calls dropped, and dropped per
    category."""

    export: str = ""
    localities: dict[str, LocalityTotals] = field(default_factory=dict)
    dropped: int = 0
    dropped_by_category: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalityReport:
    """One locality in one client's last report: the counts of its interval, and its calls in progress."""

    succeeded: int
    errored: int
    issued: int
    in_progress: int
    metrics: dict[str, tuple[int, float]]


@dataclass(frozen=True)
class ClientReport:
    """A client's last report: per cluster, its localities and drops, the interval (seconds) it covers."""

    at: float
    interval: float
    localities: dict[tuple[str, str], LocalityReport]
    dropped: dict[str, int]  # cluster -> calls dropped in the interval


class LoadStats:
    """The reports of every LRS stream, summed (module docstring). ``export_of(cluster)`` names the export a
    cluster belongs to (a subset's cluster ``NAME/KEY=VALUE`` belongs to ``NAME``)."""

    def __init__(self, interval: float, export_of: Callable[[str], str] = lambda c: c,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.export_of = export_of
        self._clock = clock
        self.clusters: dict[str, ClusterTotals] = {}
        self._last: dict[int, ClientReport] = {}
        self._seen: dict[int, float] = {}  # stream -> when its previous report came (interval fallback)
        self.reports = 0
        self.streams = 0
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ input

    def opened(self, stream: int) -> None:
        with self.lock:
            self.streams += 1
            self._seen[stream] = self._clock()

    def closed(self, stream: int) -> None:
        """The client's stream ended: what it had in flight and its rates are no longer counted."""
        with self.lock:
            self.streams -= 1
            self._last.pop(stream, None)
            self._seen.pop(stream, None)

    def record(self, stream: int, cluster_stats: Iterable[Any]) -> None:
        """One ``LoadStatsRequest``'s ``cluster_stats`` from ``stream``: added to the totals, and kept as the
        stream's last report."""
        with self.lock:
            self._record(stream, list(cluster_stats))

    def _record(self, stream: int, cluster_stats: list[Any]) -> None:
        now = self._clock()
        previous = self._seen.get(stream, now)
        self._seen[stream] = now
        localities: dict[tuple[str, str], LocalityReport] = {}
        dropped: dict[str, int] = {}
        interval = 0.0
        for cs in cluster_stats:
            name = cs.cluster_name
            totals = self.clusters.setdefault(name, ClusterTotals())
            totals.export = self.export_of(name)  # asked here, on the loop the exports change on, not at a scrape
            if cs.HasField("load_report_interval"):
                interval = max(interval, cs.load_report_interval.ToTimedelta().total_seconds())
            by_category = {d.category: d.dropped_count for d in cs.dropped_requests}
            # total_dropped_requests includes the categorized ones (load_report.proto)
            total_dropped = max(cs.total_dropped_requests, sum(by_category.values()))
            totals.dropped += total_dropped
            for category, n in by_category.items():
                totals.dropped_by_category[category] = totals.dropped_by_category.get(category, 0) + n
            dropped[name] = dropped.get(name, 0) + total_dropped
            for ls in cs.upstream_locality_stats:
                where = locality_text(ls.locality)
                t = totals.localities.setdefault(where, LocalityTotals())
                t.succeeded += ls.total_successful_requests
                t.errored += ls.total_error_requests
                t.issued += ls.total_issued_requests
                metrics = {m.metric_name: (m.num_requests_finished_with_metric, m.total_metric_value)
                           for m in ls.load_metric_stats}
                for unnamed in UNNAMED_METRICS:
                    if ls.HasField(unnamed):
                        u = getattr(ls, unnamed)
                        metrics[unnamed] = (u.num_requests_finished_with_metric, u.total_metric_value)
                for metric, (count, total) in metrics.items():
                    t.metrics.setdefault(metric, Metric()).add(count, total)
                old = localities.get((name, where))
                report = LocalityReport(ls.total_successful_requests, ls.total_error_requests,
                                        ls.total_issued_requests, ls.total_requests_in_progress, metrics)
                localities[(name, where)] = report if old is None else _merged(old, report)
        self._last[stream] = ClientReport(now, interval or max(now - previous, 0.0), localities, dropped)
        self.reports += 1

    # ------------------------------------------------------------------ output

    def in_flight(self, cluster: str, locality: str) -> int:
        """Calls in progress now at the clients, summed over their last reports."""
        return sum(r.localities[(cluster, locality)].in_progress
                   for r in self._last.values() if (cluster, locality) in r.localities)

    def view(self) -> dict[str, Any]:
        """Per cluster and locality: the totals, the calls in flight, and the rates of the clients' last reports
        (calls per second; a report older than two intervals counts no more). What ``waypost xds status --load``
        and the console show, as JSON-ready data."""
        with self.lock:
            return self._view()

    def _view(self) -> dict[str, Any]:
        now = self._clock()
        fresh = [r for r in self._last.values() if now - r.at <= 2 * max(self.interval, r.interval)]
        clusters = []
        for name in sorted(self.clusters):
            totals = self.clusters[name]
            localities = []
            for where in sorted(totals.localities):
                t = totals.localities[where]
                rates = {"issued": 0.0, "succeeded": 0.0, "errored": 0.0}
                for r in fresh:
                    lr = r.localities.get((name, where))
                    if lr is not None and r.interval > 0:
                        rates["issued"] += lr.issued / r.interval
                        rates["succeeded"] += lr.succeeded / r.interval
                        rates["errored"] += lr.errored / r.interval
                localities.append({
                    "locality": where, "in_flight": self.in_flight(name, where), "succeeded": t.succeeded,
                    "errored": t.errored, "issued": t.issued, "rates": rates,
                    "metrics": {m: {"count": v.count, "sum": v.total, "mean": v.total / v.count if v.count else 0.0}
                                for m, v in sorted(t.metrics.items())}})
            drop_rate = sum(r.dropped.get(name, 0) / r.interval for r in fresh if r.interval > 0)
            clusters.append({"cluster": name, "export": totals.export, "dropped": totals.dropped,
                             "dropped_by_category": dict(sorted(totals.dropped_by_category.items())),
                             "drop_rate": drop_rate, "localities": localities})
        return {"interval": self.interval, "clients": self.streams, "reports": self.reports, "clusters": clusters}

    def samples(self) -> list[tuple[str, str, str, LocalityTotals, int]]:
        """(export, cluster, locality, totals, in flight) of every locality reported so far (for the metrics;
        the totals are copies)."""
        with self.lock:
            return [(totals.export, name, where,
                     LocalityTotals(t.succeeded, t.errored, t.issued,
                                    {m: Metric(v.count, v.total) for m, v in t.metrics.items()}),
                     self.in_flight(name, where))
                    for name, totals in sorted(self.clusters.items()) for where, t in sorted(totals.localities.items())]

    def drops(self) -> list[tuple[str, str, int, dict[str, int]]]:
        """(export, cluster, dropped, dropped per category) of every cluster reported so far."""
        with self.lock:
            return [(t.export, name, t.dropped, dict(t.dropped_by_category))
                    for name, t in sorted(self.clusters.items())]


def _merged(a: LocalityReport, b: LocalityReport) -> LocalityReport:
    """Two entries of one locality in one report (a client may list a cluster twice, e.g. per EDS service)."""
    metrics = dict(a.metrics)
    for k, (n, s) in b.metrics.items():
        n0, s0 = metrics.get(k, (0, 0.0))
        metrics[k] = (n0 + n, s0 + s)
    return LocalityReport(a.succeeded + b.succeeded, a.errored + b.errored, a.issued + b.issued,
                          a.in_progress + b.in_progress, metrics)
