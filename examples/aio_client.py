"""The quick-start client on grpc.aio: concurrent calls spread over the live backends.

    python examples/aio_client.py [--target etcd:///127.0.0.1:2379?key=greet.rpc] [-n 6]
"""

import argparse
import asyncio

import waypost.aio

from greet_pb2 import HelloRequest
from greet_pb2_grpc import GreeterStub


async def main(target: str, n: int, balancer: str) -> None:
    async with waypost.aio.dial(target, balancer=balancer) as channel:
        stub = GreeterStub(channel)  # the generated stub, unchanged
        replies = await asyncio.gather(*(stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5) for i in range(n)))
        for reply in replies:
            print(reply.message, "from", reply.server, flush=True)


p = argparse.ArgumentParser()
p.add_argument("--target", default="etcd:///127.0.0.1:2379?key=greet.rpc")
p.add_argument("--balancer", default="round_robin")
p.add_argument("-n", type=int, default=6)
args = p.parse_args()
asyncio.run(main(args.target, args.n, args.balancer))
