"""Quick start, server side: register in etcd once the port is open; SIGTERM drains and deregisters.

    python examples/server.py [--registry etcd://127.0.0.1:2379] [--key greet.rpc] [--weight 20]
                              [--listen 127.0.0.1:0] [--advertise HOST[:PORT]]

By default it listens on loopback (a free port) and registers that address: clients on this machine reach it.
For other hosts: --listen 0.0.0.0:50051 (serve() then registers this host's own address), and --advertise
10.0.0.5 when that is not the address they should dial.
"""

import argparse
import os
from concurrent import futures

import grpc
import waypost

from greet_pb2_grpc import add_GreeterServicer_to_server
from greeter import Greeter

p = argparse.ArgumentParser()
p.add_argument("--registry", default=os.environ.get("WAYPOST_REGISTRY", "etcd://127.0.0.1:2379"))
p.add_argument("--key", default="greet.rpc")
p.add_argument("--weight", type=int, default=100)
p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
               help="where to listen (default: loopback, a free port; 0.0.0.0:50051: every interface)")
p.add_argument("--advertise", default=None, metavar="HOST[:PORT]",
               help="the address to register (default: the --listen host, else this host's address)")
args = p.parse_args()

greeter = Greeter()
server = grpc.server(futures.ThreadPoolExecutor(16))
add_GreeterServicer_to_server(greeter, server)
handle = waypost.serve(server, args.key, listen_on=args.listen, advertise=args.advertise, registry=args.registry,
                       metadata={"weight": args.weight}, grace=5)
greeter.name = handle.address
print("serving", args.key, "on", handle.address, flush=True)
handle.wait()  # SIGTERM/SIGINT: deregister, refuse new calls, finish in-flight ones
print("stopped", flush=True)
