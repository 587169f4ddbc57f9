"""Repro: backend addresses removed while calls are being picked (as under heavy registration churn).

Three threads call through a round_robin channel over two in-process Echo servers while this thread
removes and re-adds the second address every ~2 ms (what the resolver does when a publisher flaps).
Prints ``calls N flips N errors N [first errors]`` and exits 0 if no call failed, 1 otherwise. Run in a
subprocess by ``tests/chaos/test_chaos.py``: a crash (segfault) must not take the test process down.

Usage: python tests/chaos/race.py [SECONDS]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from tests.channel.support import direct, echo_servers
from waypost.types import Backend


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    errors: list[str] = []
    calls = [0]
    with echo_servers("a", "b") as (a, b):
        ch = waypost.dial(direct([a, b]), balancer="round_robin")
        stub = echo_pb2_grpc.EchoStub(ch)
        stub.Unary(echo_pb2.EchoRequest(), wait_for_ready=True, timeout=10)
        stop = time.monotonic() + seconds

        def call() -> None:
            while time.monotonic() < stop:
                try:
                    stub.Unary(echo_pb2.EchoRequest(), timeout=5)
                    calls[0] += 1
                except Exception as e:  # noqa: BLE001  # every failure counts, RpcError or not
                    errors.append(f"{type(e).__name__}: {e}"[:160])

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        keep, flap = Backend(a.address), Backend(b.address)
        flips = 0
        while time.monotonic() < stop:
            ch.balancer.update([keep])
            ch.balancer.update([keep, flap])
            flips += 1
            time.sleep(0.002)
        for t in threads:
            t.join(30)
        ch.close()
    sys.stdout.write(f"calls {calls[0]} flips {flips} errors {len(errors)} {errors[:3]}\n")
    sys.stdout.flush()
    return 1 if errors else 0


if __name__ == "__main__":
    os._exit(main())
