"""Hedged calls: SayHello with a hedgingPolicy (docs/service-config.md#hedging). A call that has not answered
after the method's recent p98 latency is sent once more to another backend; the first answer wins, the other
copy is cancelled. At most 5 % extra calls (waypost's default maxExtraShare).

    python examples/hedging_client.py [--target etcd:///127.0.0.1:2379?key=greet.rpc] [-n 6]
"""

import argparse

import waypost

from greet_pb2 import HelloRequest
from greet_pb2_grpc import GreeterStub

CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{"service": "greet.Greeter", "method": "SayHello"}],
        # SayHello is safe to run twice: only such methods may be hedged
        "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "p98", "nonFatalStatusCodes": ["UNAVAILABLE"]},
    }],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
}

p = argparse.ArgumentParser()
p.add_argument("--target", default="etcd:///127.0.0.1:2379?key=greet.rpc")
p.add_argument("-n", type=int, default=6)
args = p.parse_args()

with waypost.dial(args.target, service_config=CONFIG) as channel:
    stub = GreeterStub(channel)
    for i in range(args.n):
        reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5)
        print(reply.message, "from", reply.server, flush=True)
