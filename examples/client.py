"""Quick start, client side: dial the service name; every call goes to a live backend.

    python examples/client.py [--target etcd:///127.0.0.1:2379?key=greet.rpc] [-n 6] [--balancer round_robin]
"""

import argparse

import waypost

from greet_pb2 import HelloRequest
from greet_pb2_grpc import GreeterStub

p = argparse.ArgumentParser()
p.add_argument("--target", default="etcd:///127.0.0.1:2379?key=greet.rpc")
p.add_argument("--balancer", default=None, help="a policy name (default: waypost's default, prequal)")
p.add_argument("-n", type=int, default=6)
args = p.parse_args()

with waypost.dial(args.target, balancer=args.balancer) as channel:
    stub = GreeterStub(channel)  # the generated stub, unchanged
    for i in range(args.n):
        reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5)
        print(reply.message, "from", reply.server, flush=True)
