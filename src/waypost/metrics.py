"""Optional Prometheus metrics (``pip install 'waypost[metrics]'``, i.e. prometheus-client).

Off by default, and then free: the library's hooks read the module attribute ``current``, which is
``None`` until :func:`enable` is called, so a disabled hook costs one attribute load and a compare::

    obs = metrics.current
    if obs is not None:
        obs.call_done(target, address, code, latency)

Turn it on with ``waypost.metrics.enable()`` (the default CollectorRegistry, or pass your own) or
``waypost.metrics.serve(9464)`` (also starts prometheus-client's HTTP exporter on loopback).

The hooks are the events; the sinks record them. Prometheus is one sink, OpenTelemetry (``waypost.otel``) another:
each sink is an :class:`Observer`, and with both enabled ``current`` is a fan-out to both (``attach_sink``), so
the library calls every hook in one place whichever sinks listen.

The scrape-time gauges (in-flight calls, backends per state, per-backend load signals) are read from live
sources that the client registers with :func:`register_live_source`; this module imports nothing of the layers
above it.

The publisher gauges come from sources the discovery layer registers with :func:`register_publisher_source`.
Every metric's name, labels and meaning: the table in docs/operations.md (``target`` labels are redacted).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from .observer import Observer
from .redaction import RedactedTargets

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

_T = TypeVar("_T")

__all__ = ["Observer", "PrometheusObserver", "attach_sink", "detach_sink", "disable", "enable", "serve"]

log = logging.getLogger("waypost.metrics")

#: latency buckets (seconds): loopback calls are sub-millisecond, remote ones tens of ms
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_lock = threading.Lock()

#: the enabled sinks (``Observer``: one, or a fan-out to several), or None (disabled: every hook is skipped)
current: Observer | None = None


@dataclass(frozen=True)
class ChannelSample:
    """One live channel at scrape time: its (redacted) target, how many backends are in each connectivity
    state (every state named, zeros included), and the calls running on each backend address."""

    target: str
    backends_per_state: Mapping[str, int]
    in_flight: Sequence[tuple[str, int]]
    #: what a load-aware policy believes per backend (empty for the others)
    backend_load: Sequence[BackendLoad] = ()


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """One backend as a load-aware policy sees it (``Policy.signals``: for metrics and the statistics log).

    ``in_flight``: requests in flight (the server's count from a fresh probe with this client's part brought up
    to date, else this client's own); ``latency``: the latency estimate in seconds (None: none yet);
    ``probe_age``: seconds since the backend's last load report (None: never probed, or no load reports)."""

    address: str
    in_flight: float
    latency: float | None
    probe_age: float | None = None


#: A live source: called at every scrape, yields one sample per live channel.
LiveSource = Callable[[], Iterable[ChannelSample]]

_sources: list[LiveSource] = []


def _add_source(sources: list[_T], source: _T) -> None:
    with _lock:
        if source not in sources:
            sources.append(source)


def prometheus_registry() -> CollectorRegistry | None:
    """The CollectorRegistry metrics are recorded into (None while disabled): other layers add collectors there."""
    return None if _prometheus is None else _prometheus.registry


def register_live_source(source: LiveSource) -> None:
    """Have ``source()`` read at every scrape for the in-flight and backend-state gauges (idempotent)."""
    _add_source(_sources, source)


def unregister_live_source(source: LiveSource) -> None:
    """Stop reading ``source`` (no error if it was not registered)."""
    with _lock:
        if source in _sources:
            _sources.remove(source)


class _Fanout(Observer):
    """Several sinks behind the one ``current``: every hook calls each sink's."""

    def __init__(self, sinks: Sequence[Observer]) -> None:
        self.sinks = tuple(sinks)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name == "sinks":
            return object.__getattribute__(self, name)
        hooks = [getattr(s, name) for s in object.__getattribute__(self, "sinks")]

        def fan_out(*args: Any, **kw: Any) -> None:
            for hook in hooks:
                try:
                    hook(*args, **kw)
                except Exception:  # a sink's failure must not reach the call path, nor starve the other sinks
                    log.exception("waypost: metrics sink %r failed in %s", hook, name)
        return fan_out


#: the sinks added next to Prometheus (``attach_sink``): OpenTelemetry's
_extra_sinks: list[Observer] = []
#: the Prometheus sink, if enabled
_prometheus: PrometheusObserver | None = None


def _recompose() -> None:
    """``current`` from the enabled sinks: None, the one sink, or a fan-out to all (call with ``_lock`` held)."""
    global current
    sinks: list[Observer] = ([_prometheus] if _prometheus is not None else []) + _extra_sinks
    current = None if not sinks else sinks[0] if len(sinks) == 1 else _Fanout(sinks)


def attach_sink(sink: Observer) -> None:
    """Have every event reach ``sink`` too (idempotent; ``waypost.otel.enable`` attaches its sink here)."""
    with _lock:
        if sink not in _extra_sinks:
            _extra_sinks.append(sink)
        _recompose()


def detach_sink(sink: Observer) -> None:
    """Stop sending events to ``sink`` (no error if it was not attached)."""
    with _lock:
        if sink in _extra_sinks:
            _extra_sinks.remove(sink)
        _recompose()


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "waypost metrics need prometheus-client: install the extra with  pip install 'waypost[metrics]'"
        ) from None
    return prometheus_client


class PrometheusObserver(Observer):
    """Receives the library's events and records them in a prometheus-client ``CollectorRegistry``.

    The methods are the hooks the library calls; each is cheap and never raises into the caller.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        pc = _import_prometheus()
        self.registry = registry if registry is not None else pc.REGISTRY
        r = self.registry
        self._targets = RedactedTargets()
        self.requests = pc.Counter("waypost_client_requests", "Calls finished on a backend (one per attempt)",
                                   ["target", "backend"], registry=r)
        self.failures = pc.Counter("waypost_client_failures", "Attempts that ended with a non-OK status",
                                   ["target", "backend", "code"], registry=r)
        self.latency = pc.Histogram("waypost_client_latency_seconds", "Attempt latency", ["target", "backend"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ejections = pc.Counter("waypost_client_ejections", "Outlier-detection ejections",
                                    ["target", "backend"], registry=r)
        self.rebuilds = pc.Counter("waypost_client_picker_rebuilds", "Pickers built", ["target"], registry=r)
        self.reconnects = pc.Counter("waypost_registry_reconnects", "etcd streams re-established", ["stream"],
                                     registry=r)
        self.store_resets = pc.Counter("waypost_registry_store_resets",
                                       "etcd stores found gone back in time (emptied or restored)", registry=r)
        self.reloads = pc.Counter("waypost_watch_reloads", "Subscriber reloads", ["key", "reason"], registry=r)
        self.reregistrations = pc.Counter("waypost_lease_reregistrations",
                                          "Publishers registered again after losing their lease", ["key"],
                                          registry=r)
        self.restored = pc.Counter("waypost_registrations_restored",
                                   "Publisher records put back after an outside delete", ["key"], registry=r)
        self.resolver_errors = pc.Counter("waypost_resolver_errors",
                                          "Failed reads of a resolver's source (the last list is kept)",
                                          ["target", "reason"], registry=r)
        self.xds_streams = pc.Gauge("waypost_xds_streams", "ADS streams open", registry=r)
        self.xds_pushes = pc.Counter("waypost_xds_pushes", "xDS responses sent", ["type"], registry=r)
        self.xds_nacks = pc.Counter("waypost_xds_nacks", "xDS responses rejected by a client", ["type"], registry=r)
        self.xds_resource_count = pc.Gauge("waypost_xds_resources", "xDS resources served", ["type"], registry=r)
        self.xds_push_latency = pc.Histogram("waypost_xds_push_seconds", "From a source's change to its responses "
                                             "queued for every stream", buckets=LATENCY_BUCKETS, registry=r)
        self.xds_sources_up = pc.Gauge("waypost_xds_source_up", "1 while an xDS export's source answers, 0 while it "
                                       "fails", ["export"], registry=r)
        collectors = (_LiveCollector(self), _PublisherCollector(), _DiscoveryCollector())  # read at scrape time
        for c in collectors:
            r.register(c)
        self._all = [self.requests, self.failures, self.latency, self.ejections, self.rebuilds, self.reconnects,
                     self.store_resets, self.reloads, self.reregistrations, self.restored, self.resolver_errors,
                     self.xds_streams, self.xds_pushes, self.xds_nacks, self.xds_resource_count,
                     self.xds_push_latency, self.xds_sources_up, *collectors]

    def target_label(self, target: str) -> str:
        return self._targets[target]

    # -- data plane hooks (per attempt) -----------------------------------------------------------

    def call_done(self, target: str, backend: str, code: grpc.StatusCode, latency: float, method: str = "") -> None:
        t = self.target_label(target)
        self.requests.labels(t, backend).inc()
        self.latency.labels(t, backend).observe(latency)
        if code is not grpc.StatusCode.OK:
            self.failures.labels(t, backend, code.name).inc()

    # -- control plane hooks (per state change) -----------------------------------------------------

    def picker_rebuilt(self, target: str) -> None:
        self.rebuilds.labels(self.target_label(target)).inc()

    def backend_ejected(self, backend: str, target: str = "") -> None:
        self.ejections.labels(self.target_label(target), backend).inc()

    def backend_removed(self, target: str, backend: str) -> None:
        """``backend`` left ``target``'s address set: drop its series so churn does not grow the registry."""
        t = self.target_label(target)
        for metric in (self.requests, self.latency, self.ejections):
            with suppress(KeyError):
                metric.remove(t, backend)
        for code in grpc.StatusCode:
            with suppress(KeyError):
                self.failures.remove(t, backend, code.name)

    def registry_reconnect(self, stream: str) -> None:
        self.reconnects.labels(stream).inc()

    def store_reset(self) -> None:
        self.store_resets.inc()

    def watch_reload(self, key: str, reason: str) -> None:
        self.reloads.labels(key, reason).inc()

    def lease_reregistered(self, key: str) -> None:
        self.reregistrations.labels(key).inc()

    def registration_restored(self, key: str) -> None:
        self.restored.labels(key).inc()

    def resolver_error(self, target: str, reason: str) -> None:
        self.resolver_errors.labels(self.target_label(target), reason).inc()

    # -- xDS control plane hooks -----------------------------------------------------------------------

    def xds_stream(self, delta: int) -> None:
        self.xds_streams.inc(delta)

    def xds_push(self, type_: str) -> None:
        self.xds_pushes.labels(type_).inc()

    def xds_push_many(self, type_: str, count: int) -> None:
        self.xds_pushes.labels(type_).inc(count)

    def xds_nack(self, type_: str) -> None:
        self.xds_nacks.labels(type_).inc()

    def xds_pushed(self, seconds: float) -> None:
        self.xds_push_latency.observe(seconds)

    def xds_resources(self, type_: str, count: int) -> None:
        self.xds_resource_count.labels(type_).set(count)

    def xds_source(self, export: str, up: bool) -> None:
        self.xds_sources_up.labels(export).set(1 if up else 0)

    def unregister(self) -> None:
        for m in self._all:
            with suppress(KeyError):
                self.registry.unregister(m)


class _LiveCollector:
    """Gauges read from the live channels at scrape time (in-flight calls, backends per state, the balancing
    policy's view of each backend's load): nothing on the call path."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self._obs = observer

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families are produced at collect time

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        inflight = GaugeMetricFamily("waypost_client_in_flight", "Calls running now", labels=["target", "backend"])
        states = GaugeMetricFamily("waypost_client_backends", "Backends per connectivity state",
                                   labels=["target", "state"])
        load = GaugeMetricFamily("waypost_client_backend_load_in_flight",
                                 "Requests in flight a backend has, as the balancing policy believes",
                                 labels=["target", "backend"])
        latency = GaugeMetricFamily("waypost_client_backend_latency_estimate_seconds",
                                    "The balancing policy's latency estimate of a backend",
                                    labels=["target", "backend"])
        age = GaugeMetricFamily("waypost_client_backend_probe_age_seconds",
                                "Seconds since the backend's last load report", labels=["target", "backend"])
        for sample in live_samples():
            t = self._obs.target_label(sample.target)
            for address, n in sample.in_flight:
                inflight.add_metric([t, address], n)
            for name, count in sample.backends_per_state.items():
                states.add_metric([t, name], count)
            for b in sample.backend_load:
                load.add_metric([t, b.address], b.in_flight)
                if b.latency is not None:
                    latency.add_metric([t, b.address], b.latency)
                if b.probe_age is not None:
                    age.add_metric([t, b.address], b.probe_age)
        yield from (inflight, states, load, latency, age)


# ---- publishers: registration state, read at scrape time ----------------------------------------------


@dataclass(frozen=True)
class PublisherSample:
    """One live publisher at scrape time: its key, whether it is registered now, and for how long its
    registration has been lost against its will (0 while registered, and while paused on purpose)."""

    key: str
    registered: bool
    unregistered_seconds: float
    #: the registry (its URL, without secrets)
    registry: str = ""


#: A publisher source: called at every scrape, yields one sample per live publisher.
PublisherSource = Callable[[], Iterable[PublisherSample]]

_publisher_sources: list[PublisherSource] = []


def register_publisher_source(source: PublisherSource) -> None:
    """Have ``source()`` read at every scrape for the publisher gauges (idempotent)."""
    _add_source(_publisher_sources, source)


def publisher_gauges(samples: Iterable[PublisherSample]) -> dict[tuple[str, str], tuple[int, float]]:
    """(key, registry) -> (registered, unregistered seconds), several publishers of one key in one registry folded
    into one series: registered only when all of them are, and the longest time unregistered."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for s in samples:
        registered, seconds = out.get((s.key, s.registry), (1, 0.0))
        out[(s.key, s.registry)] = (registered if s.registered else 0, max(seconds, s.unregistered_seconds))
    return out


class _PublisherCollector:
    """``waypost_publisher_registered`` and ``waypost_publisher_unregistered_seconds``, from the sources."""

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families are produced at collect time

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        registered = GaugeMetricFamily("waypost_publisher_registered",
                                       "1 while the key's publishers in this process are registered, else 0",
                                       labels=["key", "registry"])
        lost = GaugeMetricFamily("waypost_publisher_unregistered_seconds",
                                 "Seconds the registration has been lost against the publisher's will",
                                 labels=["key", "registry"])
        for (key, where), (up, seconds) in sorted(publisher_gauges(publisher_samples()).items()):
            registered.add_metric([key, where], up)
            lost.add_metric([key, where], seconds)
        yield from (registered, lost)


@dataclass(frozen=True)
class DiscoverySample:
    """One live subscription at scrape time: its key (prefix) and whether its list is stale (from a
    serializable read or a cache file, while etcd gives no linearizable answer)."""

    key: str
    stale: bool


#: A discovery source: called at every scrape, yields one sample per live subscription.
DiscoverySource = Callable[[], Iterable[DiscoverySample]]

_discovery_sources: list[DiscoverySource] = []


def register_discovery_source(source: DiscoverySource) -> None:
    """Have ``source()`` read at every scrape for ``waypost_discovery_stale`` (idempotent)."""
    _add_source(_discovery_sources, source)


class _DiscoveryCollector:
    """``waypost_discovery_stale{key}``: 1 while the key's list is stale, 0 while live (one series per key)."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        stale = GaugeMetricFamily("waypost_discovery_stale",
                                  "1 while the key's backend list comes from a stale read or a cache file",
                                  labels=["key"])
        for key, value in stale_per_key().items():
            stale.add_metric([key], value)
        yield stale


def live_samples() -> list[ChannelSample]:
    """What the live sources say now (every live channel), for sinks that read gauges when asked."""
    return _read(_sources, "live")


def publisher_samples() -> list[PublisherSample]:
    """What the publisher sources say now (every live publisher)."""
    return _read(_publisher_sources, "publisher")


def discovery_samples() -> list[DiscoverySample]:
    """What the discovery sources say now (every live subscription)."""
    return _read(_discovery_sources, "discovery")


def stale_per_key() -> dict[str, int]:
    """key -> 1 while any subscription of the key has a stale list, else 0 (sorted by key)."""
    keys: dict[str, int] = {}
    for s in discovery_samples():
        keys[s.key] = max(keys.get(s.key, 0), int(s.stale))
    return dict(sorted(keys.items()))


def _read(sources: list[Callable[[], Iterable[_T]]], kind: str) -> list[_T]:
    with _lock:
        sources = list(sources)
    out: list[_T] = []
    for source in sources:
        try:
            out.extend(source())
        except Exception:
            log.exception("waypost: metrics %s source failed (%r)", kind, source)
    return out


def observer() -> PrometheusObserver | None:
    """The enabled Prometheus observer, or None when Prometheus metrics are off."""
    return _prometheus


def enable(registry: CollectorRegistry | None = None) -> PrometheusObserver:
    """Start recording metrics into ``registry`` (prometheus-client's default registry if None).

    Idempotent for the same registry; enabling with another registry moves the metrics there. Raises
    ImportError naming the ``waypost[metrics]`` extra if prometheus-client is not installed.
    """
    global _prometheus
    with _lock:
        if _prometheus is not None:
            if registry is None or _prometheus.registry is registry:
                return _prometheus
            _prometheus.unregister()
        _prometheus = PrometheusObserver(registry)
        _recompose()
        log.info("waypost metrics enabled")
        return _prometheus


def disable() -> None:
    """Stop recording (the hooks become no-ops again) and unregister the metrics."""
    global _prometheus
    with _lock:
        if _prometheus is not None:
            _prometheus.unregister()
            _prometheus = None
        _recompose()


def serve(port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None) -> WSGIServer:
    """``enable(registry)`` and expose it over HTTP on ``addr:port`` (prometheus-client's exporter, in a
    daemon thread). Returns the HTTP server: ``server.server_port`` is the port (``port=0`` picks a free
    one), ``server.shutdown()`` stops it."""
    pc = _import_prometheus()
    obs = enable(registry)
    server, _thread = pc.start_http_server(port, addr=addr, registry=obs.registry)  # prometheus-client >= 0.17
    return server
