"""A client inside Kubernetes: follows the greet Service's EndpointSlices and balances calls over its ready pods.

    python examples/kubernetes/client.py [--target k8s:///greet:grpc] [--calls 10] [--balancer round_robin]

One call at a time leaves every pod idle: the default policy (prequal) then keeps to the pod that answers fastest,
which is what it is for; ``--balancer round_robin`` shows the calls taking turns over the pods.

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
p.add_argument("--balancer", default=None, help="a policy name (default: waypost's default)")
args = p.parse_args()

with waypost.dial(args.target, balancer=args.balancer) as channel:
    stub = GreeterStub(channel)
    for i in range(args.calls):
        reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5)
        print(reply.message, "from", reply.server, flush=True)
