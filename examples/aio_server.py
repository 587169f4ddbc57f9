"""The quick-start server on grpc.aio.

    python examples/aio_server.py [--registry etcd://127.0.0.1:2379] [--key greet.rpc]
                                  [--listen 127.0.0.1:0] [--advertise HOST[:PORT]]

--listen and --advertise as for server.py: loopback by default, 0.0.0.0:50051 for other hosts.
"""

import argparse
import asyncio
import os

import grpc
import waypost

from greet_pb2_grpc import add_GreeterServicer_to_server
from greeter import AsyncGreeter


async def main(registry: str, key: str, listen: str, advertise: str | None) -> None:
    greeter = AsyncGreeter()
    server = grpc.aio.server()
    add_GreeterServicer_to_server(greeter, server)
    handle = await waypost.serve_async(server, key, listen_on=listen, advertise=advertise,
                                       registry=registry, grace=5)
    greeter.name = handle.address
    print("serving", key, "on", handle.address, flush=True)
    await handle.wait()  # SIGTERM/SIGINT: deregister, refuse new calls, finish in-flight ones
    print("stopped", flush=True)


p = argparse.ArgumentParser()
p.add_argument("--registry", default=os.environ.get("WAYPOST_REGISTRY", "etcd://127.0.0.1:2379"))
p.add_argument("--key", default="greet.rpc")
p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
               help="where to listen (default: loopback, a free port; 0.0.0.0:50051: every interface)")
p.add_argument("--advertise", default=None, metavar="HOST[:PORT]",
               help="the address to register (default: the --listen host, else this host's address)")
args = p.parse_args()
asyncio.run(main(args.registry, args.key, args.listen, args.advertise))
