"""A demo backend: one gRPC method that answers with the backend's name after a configurable delay.

It uses no generated code (raw bytes in, raw bytes out) so the demo needs nothing but waypost. Run as
a process: ``python -m waypost.demo.backend --registry URL --key K --name b1 [--delay-ms 2] [--weight 40]
[--slots 2]``; it prints ``READY <address>`` once registered and stops gracefully on SIGTERM/SIGINT.

Like a real service it has a finite capacity: ``slots`` calls are served at once and the others wait for a
slot (in arrival order), so a backend that gets more than its share builds a queue, and the tail shows it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from ..server import ServeHandle

SERVICE = "waypost.demo.Demo"
METHOD = f"/{SERVICE}/Hello"


#: calls a demo backend serves at once (the rest queue): with the demo's 6 client threads over 4 backends,
#: a policy that sends a slow backend more than it can take makes calls wait there.
SLOTS = 2


class _Handler:
    """Waits for one of ``slots`` service slots, sleeps around ``delay_ms`` (uniform +-50%, so latency has
    a spread) and replies with the name."""

    def __init__(self, name: str, delay_ms: float, seed: int, slots: int = SLOTS) -> None:
        self.name = name.encode()
        self.delay = delay_ms / 1000.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(slots)  # wakes waiters in arrival order

    def __call__(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.delay:
            with self._lock:
                d = self.delay * (0.5 + self._rng.random())
            with self._slots:
                time.sleep(d)
        return self.name


def build_server(name: str, delay_ms: float, workers: int = 16, slots: int = SLOTS) -> grpc.Server:
    """A not-yet-started grpc.server with the demo service."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    server = grpc.server(futures.ThreadPoolExecutor(workers, thread_name_prefix=f"demo-{name}"))
    handler = grpc.unary_unary_rpc_method_handler(
        _Handler(name, delay_ms, seed=hash(name) & 0xFFFF, slots=slots))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Hello": handler}),))
    return server


def start_backend(name: str, registry: str, key: str, delay_ms: float = 2.0, weight: int | None = None,
                  ttl: int = 5, grace: float = 2.0, slots: int = SLOTS) -> ServeHandle:
    """Start and register a demo backend in this process; returns the ``waypost.serve`` handle."""
    from ..server import serve

    metadata: dict[str, Any] = {"name": name}
    if weight is not None:
        metadata["weight"] = weight
    return serve(build_server(name, delay_ms, slots=slots), key, listen_on="127.0.0.1:0", registry=registry,
                 metadata=metadata, ttl=ttl, grace=grace)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="waypost demo backend")
    p.add_argument("--registry", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--delay-ms", type=float, default=2.0)
    p.add_argument("--weight", type=int, default=None)
    p.add_argument("--ttl", type=int, default=5)
    p.add_argument("--slots", type=int, default=SLOTS, help="calls served at once; the others queue")
    p.add_argument("--parent-pid", type=int, default=None, help="Stop when this process is gone.")
    args = p.parse_args(argv)
    from ..errors import WaypostError

    try:
        handle = start_backend(args.name, args.registry, args.key, args.delay_ms, args.weight, args.ttl,
                               slots=args.slots)
    except WaypostError as e:
        sys.stderr.write(f"backend {args.name}: {e}\n")
        return 1
    sys.stdout.write(f"READY {handle.address}\n")
    sys.stdout.flush()
    if args.parent_pid:
        threading.Thread(target=_stop_when_orphaned, args=(handle, args.parent_pid), daemon=True).start()
    handle.wait()
    return 0


def _stop_when_orphaned(handle: ServeHandle, parent: int) -> None:
    """The demo was killed without cleaning up (SIGKILL): do not outlive it."""
    while not handle.stopped:
        if os.getppid() != parent:
            handle.stop()
            return
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
