"""waypost.otel next to grpcio's own OpenTelemetry plugin (``grpcio-observability``; skipped when it is not
installed): with the plugin registered, waypost leaves the ``grpc.client.*`` names to it, so each attempt is
counted once, by grpcio, on the backend channel that carried it; waypost's own names and spans are unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

grpc_observability = pytest.importorskip("grpc_observability")
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import waypost
import waypost.otel
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.channel.support import direct

ECHO = "waypost.test.Echo"


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    r = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[r])  # one provider for both: a name recorded twice would add up
    plugin = grpc_observability.OpenTelemetryPlugin(meter_provider=provider)
    plugin.register_global()
    try:
        waypost.otel.enable(meter_provider=provider, tracing=False)  # grpc_metrics=None: the plugin is seen
        yield r
    finally:
        waypost.otel.disable()
        plugin.deregister_global()


def test_each_attempt_is_counted_once_by_grpcio_with_the_plugin_registered(reader):
    servers = [EchoServer("a").start(), EchoServer("b").start()]
    try:
        with waypost.dial(direct(servers), balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
            for _ in range(6):
                stub.Unary(echo_pb2.EchoRequest(), timeout=20)
    finally:
        for s in servers:
            s.stop(0)

    def read() -> tuple[dict[str, int], dict[str, int]]:
        started: dict[str, int] = {}
        picks: dict[str, int] = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        if m.name == "grpc.client.attempt.started" and p.attributes["grpc.method"] == f"{ECHO}/Unary":
                            t = p.attributes["grpc.target"]
                            started[t] = started.get(t, 0) + p.value
                        if m.name == "waypost.client.picks":
                            picks[p.attributes["waypost.backend"]] = p.value
        return started, picks

    # grpcio's plugin hands its measurements over from a thread of its own, a few seconds later
    started, picks = wait_until(lambda: (got := read()) and sum(got[0].values()) >= 6 and got, 30)
    assert sum(picks.values()) == 6
    # grpcio's, per backend channel (its target names the backend), and nothing from waypost under the dial target
    assert set(started) == {s.address for s in servers}
    assert sum(started.values()) == 6, started
