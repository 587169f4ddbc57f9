"""A Greeter inside Kubernetes: nothing registered; the readiness probe (grpc.health.v1) says when the pod serves.

    python examples/kubernetes/server.py [--host 0.0.0.0] [--port 50051] [--drain-delay 5]

SIGTERM (pod deleted): health NOT_SERVING at once, so the probe fails and the pod leaves the Service's
EndpointSlices while the server still answers for --drain-delay seconds; then new calls are refused and the
ones in flight finish (grace). greet.yaml runs it with the probe.
"""

import argparse
import sys
from concurrent import futures
from pathlib import Path

import grpc
import waypost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # greet_pb2*, greeter.py
from greet_pb2_grpc import add_GreeterServicer_to_server
from greeter import Greeter

p = argparse.ArgumentParser()
p.add_argument("--host", default="0.0.0.0", help="the address to listen on (a pod: all of its own)")
p.add_argument("--port", type=int, default=50051)
p.add_argument("--drain-delay", type=float, default=5.0, help="probe period x failureThreshold + a margin")
args = p.parse_args()

greeter = Greeter()
server = grpc.server(futures.ThreadPoolExecutor(16))
add_GreeterServicer_to_server(greeter, server)
handle = waypost.serve(server, "greet", listen_on=f"{args.host}:{args.port}", registry=None,
                       drain_delay=args.drain_delay, grace=10)
greeter.name = handle.address
print("serving greet on", handle.address, "(not registered: readiness through grpc.health.v1)", flush=True)
handle.wait()
print("stopped", flush=True)
