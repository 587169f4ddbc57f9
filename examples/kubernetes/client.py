"""A client inside Kubernetes: follows the greet Service's EndpointSlices and balances calls over its ready pods.

    python examples/kubernetes/client.py [--target k8s:///greet:grpc] [--calls 10]

In a pod, the configuration is the pod's own (service account token, CA, namespace); outside, the current
kubeconfig context (add ?kubeconfig=PATH&context=NAME to choose). The service account needs get/list/watch on
endpointslices (greet.yaml has the Role).
"""

import argparse
import sys
from pathlib import Path

import waypost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from greet_pb2 import HelloRequest
from greet_pb2_grpc import GreeterStub

p = argparse.ArgumentParser()
p.add_argument("--target", default="k8s:///greet:grpc")
p.add_argument("--calls", type=int, default=10)
args = p.parse_args()

with waypost.dial(args.target) as channel:
    stub = GreeterStub(channel)
    for i in range(args.calls):
        reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5)
        print(reply.message, "from", reply.server, flush=True)
