"""The OpenTelemetry sink of waypost's metric events: ``OtelSink`` is a ``waypost.metrics.Observer``, attached
next to Prometheus (``metrics.attach_sink``), so each event is recorded from the one hook that reports it.

Names follow gRPC's where gRPC has one (gRFC A66's per-call client metrics, A96's retry counts), with gRPC's
attribute names (``grpc.method``, ``grpc.target``, ``grpc.status``); the rest are ``waypost.*``. The table of
every name is ``NAMES`` (and docs/observability.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from .. import metrics
from ..redaction import RedactedTargets

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

#: A66's latency buckets (seconds) for the duration histograms
DURATION_BUCKETS = (0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
                    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
                    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)

#: every instrument: name -> (kind, unit, attributes, description). ``grpc.client.*`` only with ``grpc_metrics``.
NAMES: Mapping[str, tuple[str, str, str, str]] = {
    "grpc.client.attempt.started": ("counter", "{attempt}", "grpc.method, grpc.target",
                                    "attempts started (A66)"),
    "grpc.client.attempt.duration": ("histogram", "s", "grpc.method, grpc.target, grpc.status",
                                     "from an attempt's pick to its status (A66)"),
    "grpc.client.call.duration": ("histogram", "s", "grpc.method, grpc.target, grpc.status",
                                  "a call from start to status, every attempt and backoff included (A66)"),
    "grpc.client.call.retries": ("histogram", "{retry}", "grpc.method, grpc.target",
                                 ("retries and hedges of a call (transparent ones included); recorded for calls "
                                  "that had one (A96)")),
    "grpc.lb.wrr.rr_fallback": ("counter", "{update}", "grpc.target",
                                "weighted_round_robin scheduler updates with too few usable weights (A78)"),
    "grpc.lb.wrr.endpoint_weight_not_yet_usable": ("counter", "{endpoint}", "grpc.target",
                                                   ("endpoints of each scheduler update without a usable weight yet "
                                                    "(no report, or in the blackout period) (A78)")),
    "grpc.lb.wrr.endpoint_weight_stale": ("counter", "{endpoint}", "grpc.target",
                                          ("endpoints of each scheduler update whose weight is older than the "
                                           "expiration period (A78)")),
    "grpc.lb.wrr.endpoint_weights": ("histogram", "{weight}", "grpc.target",
                                     "the endpoints' weights at each scheduler update, 0 for unusable ones (A78)"),
    "grpc.lb.pick_first.connection_attempts_succeeded": ("counter", "{attempt}", "grpc.target",
                                                         "pick_first: connections that became usable (A78)"),
    "grpc.lb.pick_first.connection_attempts_failed": ("counter", "{attempt}", "grpc.target",
                                                      "pick_first: connection attempts that failed (A78)"),
    "grpc.lb.pick_first.disconnections": ("counter", "{disconnection}", "grpc.target",
                                          "pick_first: the backend in use lost (A78)"),
    "waypost.client.picks": ("counter", "{pick}", "grpc.target, waypost.backend",
                             "attempts sent to each backend (the balancer's picks)"),
    "waypost.client.retries": ("counter", "{attempt}",
                               "grpc.method, grpc.target, grpc.status, waypost.attempt.kind",
                               ("retries and hedges by outcome: each one's status when it ended (kind: retry or "
                                "hedge; a hedge that lost the race ends CANCELLED)")),
    "waypost.client.ejections": ("counter", "{ejection}", "grpc.target, waypost.backend",
                                 "outlier-detection ejections"),
    "waypost.client.picker_rebuilds": ("counter", "{picker}", "grpc.target",
                                       "pickers built (address set or READY set changed)"),
    "waypost.client.in_flight": ("gauge", "{call}", "grpc.target, waypost.backend", "attempts running now"),
    "waypost.client.backends": ("gauge", "{backend}", "grpc.target, waypost.state",
                                "backends per connectivity state"),
    "waypost.resolver.updates": ("counter", "{update}", "grpc.target", "backend lists a channel received"),
    "waypost.resolver.errors": ("counter", "{error}", "grpc.target, waypost.reason",
                                "failed reads of a resolver's source (the last list is kept)"),
    "waypost.registry.reconnects": ("counter", "{reconnect}", "waypost.stream",
                                    "etcd watch / keepalive streams re-established"),
    "waypost.registry.store_resets": ("counter", "{reset}", "", "etcd stores found gone back in time"),
    "waypost.discovery.reloads": ("counter", "{reload}", "waypost.key, waypost.reason",
                                  "subscriber reloads (compacted, reset, error)"),
    "waypost.discovery.stale": ("gauge", "1", "waypost.key",
                                "1 while the key's list comes from a stale read or a cache file"),
    "waypost.publisher.registered": ("gauge", "1", "waypost.key, waypost.registry",
                                     "1 while the key's publishers are registered: the registry connection's state"),
    "waypost.publisher.reregistrations": ("counter", "{registration}", "waypost.key",
                                          "publishers registered again after losing their lease"),
    "waypost.publisher.restored": ("counter", "{registration}", "waypost.key",
                                   "publisher records put back after an outside delete"),
    "waypost.xds.clients": ("updowncounter", "{stream}", "", "ADS streams open: connected xDS clients"),
    "waypost.xds.pushes": ("counter", "{response}", "waypost.xds.type", "xDS responses sent (LDS, RDS, CDS, EDS)"),
    "waypost.xds.nacks": ("counter", "{response}", "waypost.xds.type", "xDS responses a client rejected"),
    "waypost.xds.push.duration": ("histogram", "s", "",
                                  "from a source's change to its responses queued for every stream"),
    "waypost.xds.resources": ("updowncounter", "{resource}", "waypost.xds.type", "resources served per type"),
    "waypost.xds.source_up": ("updowncounter", "1", "waypost.xds.export", "1 while an export's source answers"),
}


class OtelSink(metrics.Observer):
    """Records waypost's metric events with an OpenTelemetry ``Meter``. ``grpc_metrics``: also the A66/A96
    ``grpc.client.*`` metrics (off when grpcio's own OpenTelemetry plugin records them: see ``waypost.otel``)."""

    def __init__(self, meter: Meter, grpc_metrics: bool) -> None:
        self.grpc_metrics = grpc_metrics
        self._targets = RedactedTargets()
        self._lock = threading.Lock()
        self._levels: dict[tuple[str, ...], float] = {}  # last value of each level kept in an up-down counter
        #: the instruments by name (``NAMES``)
        self.instruments = {name: self._make(meter, name, kind, unit, doc)
                            for name, (kind, unit, _a, doc) in NAMES.items()}

    def _make(self, meter: Meter, name: str, kind: str, unit: str, doc: str) -> Any:
        if kind == "counter":
            return meter.create_counter(name, unit=unit, description=doc)
        if kind == "updowncounter":
            return meter.create_up_down_counter(name, unit=unit, description=doc)
        if kind == "histogram" and unit != "s":
            return meter.create_histogram(name, unit=unit, description=doc)
        if kind == "histogram":
            try:  # bucket advice: opentelemetry-api >= 1.23
                return meter.create_histogram(name, unit=unit, description=doc,
                                              explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS))
            except TypeError:
                return meter.create_histogram(name, unit=unit, description=doc)
        callback = {"waypost.client.in_flight": self._in_flight, "waypost.client.backends": self._backends,
                    "waypost.discovery.stale": self._stale, "waypost.publisher.registered": self._registered}[name]
        return meter.create_observable_gauge(name, callbacks=[callback], unit=unit, description=doc)

    def target(self, target: str) -> str:
        """``target`` as an attribute: without secrets (computed once per target)."""
        return self._targets[target]

    def _level(self, name: str, value: float, attributes: dict[str, str]) -> None:
        """Set a level kept in the up-down counter ``name`` (the API's synchronous gauge is too recent to rely
        on)."""
        key = (name, *attributes.values())
        with self._lock:
            delta = value - self._levels.get(key, 0.0)
            self._levels[key] = value
        if delta:
            self.instruments[name].add(delta, attributes)

    # -- the client's own events (``waypost.otel.client``) ----------------------------------------------------

    def attempt_started(self, method: str, target: str, backend: str) -> None:
        t = self.target(target)
        self.instruments["waypost.client.picks"].add(1, {"grpc.target": t, "waypost.backend": backend})
        if self.grpc_metrics:
            self.instruments["grpc.client.attempt.started"].add(1, {"grpc.method": method, "grpc.target": t})

    def attempt_ended(self, method: str, target: str, code: grpc.StatusCode, latency: float, kind: str) -> None:
        attributes = {"grpc.method": method, "grpc.target": self.target(target), "grpc.status": code.name}
        if self.grpc_metrics:
            self.instruments["grpc.client.attempt.duration"].record(latency, attributes)
        if kind != "first":  # a first attempt's outcome is grpc.client.attempt.duration's (one SDK call less)
            self.instruments["waypost.client.retries"].add(1, {**attributes, "waypost.attempt.kind": kind})

    def call_ended(self, method: str, target: str, code: grpc.StatusCode, seconds: float, retries: int) -> None:
        if not self.grpc_metrics:
            return
        t = self.target(target)
        attributes = {"grpc.method": method, "grpc.target": t}
        self.instruments["grpc.client.call.duration"].record(seconds, {**attributes, "grpc.status": code.name})
        if retries:
            self.instruments["grpc.client.call.retries"].record(retries, attributes)

    # -- metrics.Observer: the events every sink receives -------------------------------------------------------

    def picker_rebuilt(self, target: str) -> None:
        self.instruments["waypost.client.picker_rebuilds"].add(1, {"grpc.target": self.target(target)})

    def backend_ejected(self, backend: str, target: str = "") -> None:
        attributes = {"grpc.target": self.target(target), "waypost.backend": backend}
        self.instruments["waypost.client.ejections"].add(1, attributes)

    def wrr_scheduler_update(self, target: str, weights: Sequence[float], not_yet_usable: int, stale: int,
                             rr_fallback: bool) -> None:
        attributes = {"grpc.target": self.target(target)}
        if rr_fallback:
            self.instruments["grpc.lb.wrr.rr_fallback"].add(1, attributes)
        if not_yet_usable:
            self.instruments["grpc.lb.wrr.endpoint_weight_not_yet_usable"].add(not_yet_usable, attributes)
        if stale:
            self.instruments["grpc.lb.wrr.endpoint_weight_stale"].add(stale, attributes)
        for w in weights:
            self.instruments["grpc.lb.wrr.endpoint_weights"].record(max(w, 0.0), attributes)

    def pick_first_event(self, target: str, event: str) -> None:
        self.instruments[f"grpc.lb.pick_first.{event}"].add(1, {"grpc.target": self.target(target)})

    def resolver_update(self, target: str) -> None:
        self.instruments["waypost.resolver.updates"].add(1, {"grpc.target": self.target(target)})

    def registry_reconnect(self, stream: str) -> None:
        self.instruments["waypost.registry.reconnects"].add(1, {"waypost.stream": stream})

    def store_reset(self) -> None:
        self.instruments["waypost.registry.store_resets"].add(1)

    def watch_reload(self, key: str, reason: str) -> None:
        self.instruments["waypost.discovery.reloads"].add(1, {"waypost.key": key, "waypost.reason": reason})

    def lease_reregistered(self, key: str) -> None:
        self.instruments["waypost.publisher.reregistrations"].add(1, {"waypost.key": key})

    def registration_restored(self, key: str) -> None:
        self.instruments["waypost.publisher.restored"].add(1, {"waypost.key": key})

    def resolver_error(self, target: str, reason: str) -> None:
        attributes = {"grpc.target": self.target(target), "waypost.reason": reason}
        self.instruments["waypost.resolver.errors"].add(1, attributes)

    def xds_stream(self, delta: int) -> None:
        self.instruments["waypost.xds.clients"].add(delta)

    def xds_push(self, type_: str) -> None:
        self.instruments["waypost.xds.pushes"].add(1, {"waypost.xds.type": type_})

    def xds_push_many(self, type_: str, count: int) -> None:
        self.instruments["waypost.xds.pushes"].add(count, {"waypost.xds.type": type_})

    def xds_nack(self, type_: str) -> None:
        self.instruments["waypost.xds.nacks"].add(1, {"waypost.xds.type": type_})

    def xds_pushed(self, seconds: float) -> None:
        self.instruments["waypost.xds.push.duration"].record(seconds)

    def xds_resources(self, type_: str, count: int) -> None:
        self._level("waypost.xds.resources", count, {"waypost.xds.type": type_})

    def xds_source(self, export: str, up: bool) -> None:
        self._level("waypost.xds.source_up", 1 if up else 0, {"waypost.xds.export": export})

    # -- gauges read when the SDK collects --------------------------------------------------------------------

    def _in_flight(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for sample in metrics.live_samples():
            t = self.target(sample.target)
            for address, n in sample.in_flight:
                yield Observation(n, {"grpc.target": t, "waypost.backend": address})

    def _backends(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for sample in metrics.live_samples():
            t = self.target(sample.target)
            for state, n in sample.backends_per_state.items():
                yield Observation(n, {"grpc.target": t, "waypost.state": state})

    def _stale(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for key, value in metrics.stale_per_key().items():
            yield Observation(value, {"waypost.key": key})

    def _registered(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for (key, where), (up, _seconds) in sorted(metrics.publisher_gauges(metrics.publisher_samples()).items()):
            yield Observation(up, {"waypost.key": key, "waypost.registry": where})
