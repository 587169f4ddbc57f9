"""Eureka faults with real processes: the Eureka server stopped and started again empty (every instance registers
again, clients lose no call), and a backend SIGKILLed (Eureka evicts it after its lease; clients move away). Its own
Eureka server (these tests stop it); figures printed as FIGURE lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.eureka import support as eureka_support
from tests.eureka.support import EurekaServer, unique_app
from waypost.registries.eureka.registrar import EurekaPublisher

pytestmark = [eureka_support.timeout_mark()]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def eureka() -> Iterator[EurekaServer]:
    if why := eureka_support.skip_reason():
        pytest.skip(why)
    with EurekaServer() as server:
        yield server


class Load:
    """Calls in a loop on a thread (bounded by the test): which backend answered, and every failure."""

    def __init__(self, stub: echo_pb2_grpc.EchoStub) -> None:
        self.stub = stub
        self.seen: list[tuple[float, str]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 120  # bounded whatever the test does
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self.seen.append((time.monotonic(), self.stub.Unary(echo_pb2.EchoRequest(), timeout=10).server))
            except grpc.RpcError as e:
                self.failed.append(f"{e.code()}: {e.details()}")
            time.sleep(0.01)

    def __enter__(self) -> Load:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def recent(self, n: int = 20) -> set[str]:
        return {s for _, s in self.seen[-n:]}


def test_eureka_restarted_empty_every_instance_registers_again_and_no_call_fails(eureka: EurekaServer) -> None:
    key = unique_app("restart")
    servers = [EchoServer(f"r{i}").start() for i in range(2)]
    pubs = [EurekaPublisher(eureka.url, key, s.address, ttl=3).start() for s in servers]
    try:
        wait_until(lambda: len(eureka.listed(key)) == 2, 15, what="both readable")
        with waypost.dial(f"eureka://{eureka.address}/{key}?interval=0.5s", balancer="round_robin") as ch, \
                Load(echo_pb2_grpc.EchoStub(ch)) as load:
            wait_until(lambda: load.recent() == {"r0", "r1"}, 30, what="both serve")
            eureka.stop()  # its registry lives in memory: it comes back empty
            eureka.start()
            back = time.monotonic()
            wait_until(lambda: len(eureka.listed(key)) == 2, 60, what="both registered again")
            seconds = time.monotonic() - back
            print(f"\nFIGURE eureka re-registration after a restart: {seconds:.2f} s from the server answering to "
                  f"both instances readable (ttl 3 s: heartbeats every 1 s; read cache 1 s); server start "
                  f"{eureka.startup_seconds[-1]:.1f} s")
            assert all(p.registrations >= 2 for p in pubs)
            mark = len(load.seen)
            wait_until(lambda: {s for _, s in load.seen[mark:]} == {"r0", "r1"}, 30, what="both serve again")
        assert load.failed == []
    finally:
        for p in pubs:
            p.stop()
        for s in servers:
            s.stop(0)


CHILD = textwrap.dedent("""
    import sys
    from concurrent import futures
    import grpc, waypost
    from harness.backends import echo_pb2_grpc
    from harness.backends.server import EchoServicer

    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("child"), server)
    handle = waypost.serve(server, sys.argv[2], listen_on="127.0.0.1:0", registry=sys.argv[1], ttl=3)
    print("ADDRESS", handle.address, flush=True)
    handle.wait()
""")


def test_a_sigkilled_backend_is_evicted_after_its_lease_and_clients_move_away(eureka: EurekaServer,
                                                                              tmp_path: Path) -> None:
    key = unique_app("killed")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, str(script), eureka.url, key], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    survivor = EchoServer("survivor").start()
    pub = EurekaPublisher(eureka.url, key, survivor.address, ttl=3).start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ADDRESS "), line
        child = line.split()[1]
        wait_until(lambda: len(eureka.listed(key)) == 2, 15, what="both readable")
        with waypost.dial(f"eureka://{eureka.address}/{key}?interval=0.5s", balancer="round_robin") as ch, \
                Load(echo_pb2_grpc.EchoStub(ch)) as load:
            wait_until(lambda: load.recent() == {"child", "survivor"}, 30, what="both serve")
            proc.send_signal(signal.SIGKILL)  # no DELETE: only the lease's expiry removes it
            killed = time.monotonic()
            wait_until(lambda: not any(i.endswith(child.rsplit(":", 1)[1]) for i in eureka.listed(key)), 60,
                       what="evicted by Eureka")
            print(f"\nFIGURE eureka eviction of a SIGKILLed backend: {time.monotonic() - killed:.2f} s (lease 3 s, "
                  "eviction every 1 s, read cache 1 s)")
            mark = len(load.seen)
            wait_until(lambda: len(load.seen) > mark + 20, 30, what="calls go on")
            assert {s for _, s in load.seen[mark:]} == {"survivor"}
    finally:
        proc.kill()
        proc.wait(10)
        pub.stop()
        survivor.stop(0)
