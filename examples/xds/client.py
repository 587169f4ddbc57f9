"""A plain grpcio client of the greet service through waypost's xDS control plane: no waypost in this process.

    GRPC_XDS_BOOTSTRAP_CONFIG="$(waypost xds bootstrap --server waypost-xds:18000)" \
        python examples/xds/client.py [--target xds:///greeter] [--calls 10]

gRPC's own xDS client asks the control plane for the service and balances every call in its core.
"""

import argparse
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from greet_pb2 import HelloRequest
from greet_pb2_grpc import GreeterStub

p = argparse.ArgumentParser()
p.add_argument("--target", default="xds:///greeter")
p.add_argument("--calls", type=int, default=10)
args = p.parse_args()

with grpc.insecure_channel(args.target) as channel:
    stub = GreeterStub(channel)
    for i in range(args.calls):
        reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=10, wait_for_ready=True)
        print(reply.message, "from", reply.server, flush=True)
