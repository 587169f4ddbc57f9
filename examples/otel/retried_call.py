"""OpenTelemetry traces and metrics of a balanced call retried onto another backend (docs/observability.md).

Two Greeter backends served with ``waypost.serve`` (no registry: a direct:/// target); the first fails every call
with UNAVAILABLE, so a call that starts there is retried on the other. The traces and metrics go to an OTLP
collector (any: the OpenTelemetry Collector, Jaeger, Tempo...), or to the console:

    pip install 'waypost[otel]' opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc
    python examples/otel/retried_call.py --otlp http://127.0.0.1:4317
    python examples/otel/retried_call.py --console        # no collector: print the spans and metrics
"""

from __future__ import annotations

import argparse
import sys
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the examples' generated stubs
import waypost
import waypost.otel

import greet_pb2
import greet_pb2_grpc
from greeter import Greeter


class Unavailable(Greeter):
    def SayHello(self, request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "this backend is failing")


def setup(args: argparse.Namespace) -> tuple[TracerProvider, MeterProvider]:
    """The application's OpenTelemetry SDK, as usual: providers and exporters; then waypost.otel.enable()."""
    resource = Resource.create({"service.name": "waypost-example"})
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        spans, points = OTLPSpanExporter(endpoint=args.otlp, insecure=True), OTLPMetricExporter(endpoint=args.otlp,
                                                                                               insecure=True)
    else:
        spans, points = ConsoleSpanExporter(), ConsoleMetricExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(points)])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    waypost.otel.enable()
    return tracer_provider, meter_provider


def main() -> None:
    p = argparse.ArgumentParser()
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--otlp", metavar="URL", help="an OTLP/gRPC collector, e.g. http://127.0.0.1:4317")
    out.add_argument("--console", action="store_true", help="print the spans and metrics instead")
    p.add_argument("-n", type=int, default=4, help="calls to make")
    args = p.parse_args()
    tracer_provider, meter_provider = setup(args)

    handles = []
    for servicer in (Unavailable(), Greeter("healthy")):
        server = grpc.server(futures.ThreadPoolExecutor(4))
        greet_pb2_grpc.add_GreeterServicer_to_server(servicer, server)
        handles.append(waypost.serve(server, "greet.rpc", listen_on="127.0.0.1:0", registry=None))
    target = "direct:///" + ",".join(h.address for h in handles)
    config = {"methodConfig": [{"name": [{"service": "greet.Greeter"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    with trace.get_tracer("example").start_as_current_span("example.main"), \
            waypost.dial(target, balancer="round_robin", service_config=config, block=True) as channel:
        stub = greet_pb2_grpc.GreeterStub(channel)
        for i in range(args.n):
            print(stub.SayHello(greet_pb2.HelloRequest(name=f"call {i}"), timeout=5).message, file=sys.stderr)
    for h in handles:
        h.stop()
    tracer_provider.shutdown()
    meter_provider.shutdown()


if __name__ == "__main__":
    main()
