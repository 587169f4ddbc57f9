"""A backend node for the chaos scenarios: one Echo server on ``--ports`` loopback ports, each port
registered by its own waypost Publisher (registered only after the port is open).

Run: ``python harness/chaos/node.py --registry URL --key K --name NAME [--ports N] [--ttl S]``.
It prints ``READY <json list of addresses>`` once every address is registered, then reads commands on stdin:

- ``churn SECONDS RATE SEED``: pause/resume random publishers at about RATE changes per second for
  SECONDS, then print ``LIVE <monotonic time of the last change> <json list of registered addresses>``.
  (CLOCK_MONOTONIC is system-wide on Linux, so the test process can compare the time.)
- ``quit`` or end of input: stop every publisher (revoking), stop the server, exit.

Ending on end of input means the node never outlives the process that started it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import grpc

import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer
from waypost import Publisher


def _churn(pubs: list[Publisher], seconds: float, rate: float, seed: int) -> float:
    """Pause/resume random publishers; returns the monotonic time the last change was made."""
    rng = random.Random(seed)
    interval = 1.0 / rate
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    last = next_at
    while time.monotonic() < end:
        p = rng.choice(pubs)
        if p.state == "running":
            p.pause()
        else:
            p.resume()
        last = time.monotonic()
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--registry", required=True, action="append", help="several: registered in each (with --serve)")
    ap.add_argument("--key", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--ports", type=int, default=1)
    ap.add_argument("--ttl", type=int, default=10)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--serve", action="store_true",
                    help="one port, registered and stopped by waypost.serve (its own graceful stop on quit)")
    args = ap.parse_args(argv)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers), options=[("grpc.so_reuseport", 0)])
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(args.name), server)
    registry = args.registry[0] if len(args.registry) == 1 else args.registry
    if args.serve:
        handle = waypost.serve(server, args.key, listen_on="127.0.0.1:0", registry=registry, ttl=args.ttl,
                               grace=5.0, register_timeout=30.0)
        sys.stdout.write(f"READY {json.dumps([handle.address])}\n")
        sys.stdout.flush()
        for line in sys.stdin:
            if line.split()[:1] == ["quit"]:
                break
        handle.stop()
        return 0
    ports = [server.add_insecure_port("127.0.0.1:0") for _ in range(args.ports)]
    server.start()
    addresses = [f"127.0.0.1:{p}" for p in ports]
    pubs = [Publisher(args.registry[0], args.key, a, ttl=args.ttl, timeout=30.0) for a in addresses]
    for p in pubs:
        p.start()
    sys.stdout.write(f"READY {json.dumps(addresses)}\n")
    sys.stdout.flush()
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "churn":
                t_end = _churn(pubs, float(cmd[1]), float(cmd[2]), int(cmd[3]))
                live = [p.value for p in pubs if p.state == "running"]
                sys.stdout.write(f"LIVE {t_end} {json.dumps(live)}\n")
                sys.stdout.flush()
            elif cmd[0] == "quit":
                break
    finally:
        for p in pubs:
            p.stop()
        # keep serving while the clients learn of the deregistration: a grpcio server refuses calls that
        # arrive once stop() has begun with CANCELLED (not UNAVAILABLE), which no retryPolicy retries
        time.sleep(1.0)
        server.stop(1.0).wait(5)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait for the control loop's daemon thread
