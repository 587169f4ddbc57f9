"""What waypost.otel costs per call: the same sync unary calls on one loopback Echo server, four ways, each in a
fresh process: ``off`` (waypost.otel not enabled), ``metrics`` (the SDK's MeterProvider with a reader),
``traces`` (the SDK's TracerProvider, spans created and dropped: no processor) and ``both``. Reported per
variant: the client's CPU time per call (median over ``--rounds`` processes, the variants alternating) and its
difference to ``off``.

Usage: python bench/otel_cost.py [--calls 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
variant, calls = sys.argv[1], int(sys.argv[2])
if variant != "off":
    import waypost.otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    waypost.otel.enable(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
                        tracer_provider=TracerProvider(), metrics_on=variant in ("metrics", "both"),
                        tracing=variant in ("traces", "both"))
server = EchoServer("a").start()
with waypost.dial("direct:///" + server.address) as ch:
    stub = echo_pb2_grpc.EchoStub(ch)
    req = echo_pb2.EchoRequest()
    for _ in range(200):
        stub.Unary(req, timeout=10)
    c0 = time.process_time()
    for _ in range(calls):
        stub.Unary(req, timeout=10)
    cpu = time.process_time() - c0
server.stop(0)
print(json.dumps({"variant": variant, "cpu_us_per_call": cpu / calls * 1e6}))
"""

VARIANTS = ("off", "metrics", "traces", "both")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:
            out = subprocess.run([sys.executable, "-c", CHILD, v, str(args.calls)], capture_output=True, text=True,
                                 timeout=300, check=True)
            got[v].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_us_per_call"])
    base = statistics.median(got["off"])
    for v in VARIANTS:
        m = statistics.median(got[v])
        print(f"{v:8s} client CPU {m:7.1f} us/call  (+{m - base:5.1f} us vs off)  rounds: "
              + ", ".join(f"{x:.1f}" for x in got[v]))


if __name__ == "__main__":
    main()
