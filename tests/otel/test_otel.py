"""waypost.otel with the OpenTelemetry SDK's in-memory reader and exporter, real gRPC servers, real sync and aio
channels: a call retried onto another backend is one call span with an attempt span per backend, each server's
span joins its attempt; the metric names and attributes are the documented ones; without OpenTelemetry installed
nothing breaks."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import waypost
import waypost.aio
import waypost.otel
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.channel.support import direct
from waypost.otel.server import mount
from waypost.otel.sink import NAMES

ECHO = "waypost.test.Echo"
RETRY = {"methodConfig": [{"name": [{"service": ECHO}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]}
# "a" fails every call UNAVAILABLE: a call that starts there is retried on "b"
FAIL_ON_A = echo_pb2.EchoRequest(fail_on="a", error_code=grpc.StatusCode.UNAVAILABLE.value[0])


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[tuple[dict[str, object], object]]]:
        out: dict[str, list[tuple[dict[str, object], object]]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        value = getattr(p, "value", None)
                        out.setdefault(m.name, []).append((dict(p.attributes), value if value is not None else p.count))
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    waypost.otel.enable(meter_provider=o.meter_provider, tracer_provider=o.tracer_provider, grpc_metrics=True)
    try:
        yield o
    finally:
        waypost.otel.disable()


@pytest.fixture
def servers(otel: Otel) -> Iterator[list[EchoServer]]:
    started = []
    try:
        for name in ("a", "b"):
            s = EchoServer(name)
            mount(s.server, lambda: otel.tracer_provider.get_tracer("test"))  # what waypost.serve does
            started.append(s.start())
        yield started
    finally:
        for s in started:
            s.stop(0)


def retried_call_tree(spans: list, backends: dict[str, str]) -> tuple:
    """The (call span, its attempt spans, each attempt's server span) of the first call retried onto another
    backend."""
    by_parent: dict[int, list] = {}
    for s in spans:
        if s.parent is not None:
            by_parent.setdefault(s.parent.span_id, []).append(s)
    for call in spans:
        if call.name != f"Sent.{ECHO}.Unary":
            continue
        attempts = sorted(by_parent.get(call.context.span_id, []), key=lambda s: s.start_time)
        if len(attempts) == 2:
            servers = [by_parent.get(a.context.span_id, []) for a in attempts]
            return call, attempts, servers
    raise AssertionError(f"no call retried onto another backend among {[s.name for s in spans]}")


def print_tree(call, attempts, servers) -> str:
    lines = [f"{call.name} [{call.status.status_code.name}] trace={call.context.trace_id:032x}"]
    for a, srv in zip(attempts, servers):
        attrs = a.attributes
        lines.append(f"  {a.name} backend={attrs['waypost.backend']} kind={attrs['waypost.attempt.kind']} "
                     f"reason={attrs.get('waypost.attempt.reason', '-')} policy={attrs['waypost.lb.policy']} "
                     f"status={attrs['rpc.grpc.status_code']}")
        for s in srv:
            lines.append(f"    {s.name} (server span, kind={s.kind.name})")
    return "\n".join(lines)


def check_tree(otel: Otel, servers: list[EchoServer]) -> None:
    a, b = (s.address for s in servers)
    call, attempts, srv = retried_call_tree(otel.spans.get_finished_spans(), {a: "a", b: "b"})
    print(print_tree(call, attempts, srv))
    assert [x.attributes["waypost.backend"] for x in attempts] == [a, b]
    assert [x.attributes["waypost.attempt.kind"] for x in attempts] == ["first", "retry"]
    assert attempts[1].attributes["waypost.attempt.reason"] == "previous attempt UNAVAILABLE"
    assert attempts[0].attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert attempts[1].attributes["rpc.grpc.status_code"] == 0
    assert {x.attributes["waypost.lb.policy"] for x in attempts} == {"round_robin"}
    assert call.status.is_ok and not attempts[0].status.is_ok
    # each server's span is the child of the attempt that reached it, in the client's trace
    assert [[s.name for s in group] for group in srv] == [[f"Recv.{ECHO}.Unary"]] * 2
    assert {s.context.trace_id for group in srv for s in group} == {call.context.trace_id}


def test_a_retried_sync_call_is_a_call_span_with_an_attempt_span_per_backend(otel, servers):
    with waypost.dial(direct(servers), balancer="round_robin", service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
        replies = {stub.Unary(FAIL_ON_A, timeout=20).server for _ in range(4)}
        live = otel.points()  # the gauges read from the live channel when the SDK collects
    assert replies == {"b"}
    ready = [v for attrs, v in live["waypost.client.backends"]
             if attrs == {"grpc.target": direct(servers), "waypost.state": "READY"}]
    assert ready == [2]
    assert {attrs["waypost.backend"] for attrs, _v in live["waypost.client.in_flight"]} <= {s.address for s in servers}
    check_tree(otel, servers)
    points = otel.points()
    target = direct(servers)
    durations = {p[0]["grpc.status"]: p[1] for p in points["grpc.client.attempt.duration"]}
    retried = durations["UNAVAILABLE"]  # calls that started on "a" (round_robin decides how many: at least one)
    assert retried >= 1 and durations["OK"] == 4
    started = {(p[0]["grpc.method"], p[0]["grpc.target"]): p[1] for p in points["grpc.client.attempt.started"]}
    assert started == {(f"{ECHO}/Unary", target): 4 + retried}
    assert {p[0]["grpc.status"]: p[1] for p in points["grpc.client.call.duration"]} == {"OK": 4}
    assert [p[1] for p in points["grpc.client.call.retries"]] == [retried]  # calls that had a retry
    kinds = {(p[0]["waypost.attempt.kind"], p[0]["grpc.status"]): p[1] for p in points["waypost.client.retries"]}
    assert kinds == {("retry", "OK"): retried}
    picks = {p[0]["waypost.backend"]: p[1] for p in points["waypost.client.picks"]}
    assert picks == {servers[0].address: retried, servers[1].address: 4}
    assert points["waypost.resolver.updates"][0][0] == {"grpc.target": target}
    assert set(points) <= set(NAMES)


def test_a_retried_aio_call_is_traced_alike(otel, servers):
    async def run() -> set[str]:
        async with waypost.aio.dial(direct(servers), balancer="round_robin", service_config=RETRY) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await ch.channel_ready() if hasattr(ch, "channel_ready") else None
            for _ in range(300):
                if len(ch.balancer.ready_addresses()) == 2:
                    break
                await asyncio.sleep(0.05)
            return {(await stub.Unary(FAIL_ON_A, timeout=20)).server for _ in range(4)}

    assert asyncio.run(asyncio.wait_for(run(), 60)) == {"b"}
    check_tree(otel, servers)


def test_grpcio_plugin_decides_who_records_the_grpc_client_names(servers):
    o = Otel()
    waypost.otel.enable(meter_provider=o.meter_provider, tracer_provider=o.tracer_provider, grpc_metrics=False)
    try:
        with waypost.dial(direct(servers), balancer="round_robin") as ch:
            echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=20)
    finally:
        waypost.otel.disable()
    names = set(o.points())
    assert not {n for n in names if n.startswith("grpc.client.")}
    assert "waypost.client.picks" in names


def test_without_opentelemetry_nothing_breaks_and_enable_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if not installed
        "import waypost, waypost.channel, waypost.aio, waypost.otel\n"
        "assert not waypost.otel.enabled()\n"
        "try:\n"
        "    waypost.otel.enable()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'waypost[otel]'" in out.stdout


def test_the_example_sends_a_retried_calls_spans_with_a_console_exporter():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    out = subprocess.run([sys.executable, "otel/retried_call.py", "--console", "-n", "4"], cwd=examples, check=False,
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    names = [line.split('"')[3] for line in out.stdout.splitlines() if line.strip().startswith('"name": "')]
    calls = names.count("Sent.greet.Greeter.SayHello")
    assert calls == 4
    # the failing backend's attempts were retried: more attempts than calls, a server span for each attempt
    assert names.count("Attempt.greet.Greeter.SayHello") == names.count("Recv.greet.Greeter.SayHello") > calls
    assert "grpc.client.attempt.duration" in names and "waypost.client.picks" in names


def test_the_example_sends_to_an_otlp_collector():
    """A real OTLP/gRPC receiver (opentelemetry-proto's services on a grpc.server) gets the example's spans and
    metrics (skipped without the example's OTLP exporter)."""
    from concurrent import futures
    from pathlib import Path

    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    spans: list[str] = []
    metric_names: set[str] = set()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            spans.extend(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):
            metric_names.update(m.name for rm in request.resource_metrics for sm in rm.scope_metrics
                                for m in sm.metrics)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    collector = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), collector)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), collector)
    port = collector.add_insecure_port("127.0.0.1:0")
    collector.start()
    try:
        examples = Path(__file__).resolve().parents[2] / "examples"
        out = subprocess.run([sys.executable, "otel/retried_call.py", "--otlp", f"http://127.0.0.1:{port}", "-n", "4"],
                             cwd=examples, check=False, capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
    finally:
        collector.stop(0)
    assert spans.count("Sent.greet.Greeter.SayHello") == 4
    assert spans.count("Attempt.greet.Greeter.SayHello") == spans.count("Recv.greet.Greeter.SayHello") > 4
    assert {"grpc.client.attempt.duration", "grpc.client.call.duration", "waypost.client.picks"} <= metric_names
