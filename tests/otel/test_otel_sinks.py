"""waypost.metrics' events reach every enabled sink: Prometheus as before, OpenTelemetry next to it (the
fan-out), and each sink alone again once the other is off."""

from __future__ import annotations

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk")
prometheus_client = pytest.importorskip("prometheus_client")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import waypost.otel
from waypost import metrics


def otel_values(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, object], ...]], object]:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, tuple(sorted(p.attributes.items())))] = getattr(p, "value", None) or p.count
    return out


def test_every_event_reaches_prometheus_and_opentelemetry_alike():
    registry = prometheus_client.CollectorRegistry()
    reader = InMemoryMetricReader()
    prom = metrics.enable(registry)
    waypost.otel.enable(meter_provider=MeterProvider(metric_readers=[reader]), tracing=False)
    try:
        obs = metrics.current
        assert obs is not None and obs is not prom  # the fan-out to both
        target = "etcd://user:s3cret@127.0.0.1:2379/k"
        obs.call_done(target, "10.0.0.1:1", grpc.StatusCode.UNAVAILABLE, 0.002, "/s.S/M")
        obs.backend_ejected("10.0.0.1:1", target)
        obs.registry_reconnect("watch")
        obs.watch_reload("greet.rpc", "compacted")
        obs.resolver_error(target, "refused")
        obs.xds_stream(1)
        obs.xds_push("EDS")
        obs.xds_push_many("EDS", 3)  # a push to three streams, counted at once
        obs.xds_nack("EDS")
        obs.xds_resources("CDS", 3)
        obs.xds_resources("CDS", 2)
        obs.xds_source("greet", True)
        got = otel_values(reader)
        sample = registry.get_sample_value
        label = prom.target_label(target)
        assert sample("waypost_client_failures_total", {"target": label, "backend": "10.0.0.1:1",
                                                        "code": "UNAVAILABLE"}) == 1
        assert sample("waypost_client_ejections_total", {"target": label, "backend": "10.0.0.1:1"}) == 1
        assert sample("waypost_xds_nacks_total", {"type": "EDS"}) == 1
        assert sample("waypost_xds_pushes_total", {"type": "EDS"}) == 4
        assert sample("waypost_xds_resources", {"type": "CDS"}) == 2
    finally:
        waypost.otel.disable()
        metrics.disable()
    assert "s3cret" not in label
    assert got == {
        ("waypost.client.ejections", (("grpc.target", label), ("waypost.backend", "10.0.0.1:1"))): 1,
        ("waypost.registry.reconnects", (("waypost.stream", "watch"),)): 1,
        ("waypost.discovery.reloads", (("waypost.key", "greet.rpc"), ("waypost.reason", "compacted"))): 1,
        ("waypost.resolver.errors", (("grpc.target", label), ("waypost.reason", "refused"))): 1,
        ("waypost.xds.clients", ()): 1,
        ("waypost.xds.pushes", (("waypost.xds.type", "EDS"),)): 4,
        ("waypost.xds.nacks", (("waypost.xds.type", "EDS"),)): 1,
        ("waypost.xds.resources", (("waypost.xds.type", "CDS"),)): 2,
        ("waypost.xds.source_up", (("waypost.xds.export", "greet"),)): 1,
    }


def test_each_sink_alone_is_current_itself_and_none_when_both_are_off():
    reader = InMemoryMetricReader()
    waypost.otel.enable(meter_provider=MeterProvider(metric_readers=[reader]), tracing=False)
    try:
        assert type(metrics.current).__name__ == "OtelSink" and metrics.observer() is None
        prom = metrics.enable(prometheus_client.CollectorRegistry())
        assert metrics.current is not prom
        waypost.otel.disable()
        assert metrics.current is prom
    finally:
        waypost.otel.disable()
        metrics.disable()
    assert metrics.current is None and not waypost.otel.enabled()


def test_an_observer_counting_pushes_one_at_a_time_sees_a_push_to_many_streams_as_that_many():
    from waypost.observer import Observer

    class OneAtATime(Observer):
        def __init__(self) -> None:
            self.pushes: list[str] = []

        def xds_push(self, type_: str) -> None:
            self.pushes.append(type_)

    obs = OneAtATime()
    obs.xds_push_many("EDS", 3)
    assert obs.pushes == ["EDS", "EDS", "EDS"]
