"""The channel's load prober on its own: what it refuses to probe, and how it reports answers and failures
(real servers: one with load reports, one without)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServer, EchoServicer
from waypost.client.prober import SubConnProber
from waypost.client.subconn import SubConn
from waypost.server import serve
from waypost.types import IDLE, READY, Backend


class Sink:
    """Stands in for the policy: records answers and failures."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, int, float | None]] = []
        self.failures: list[tuple[str, bool]] = []
        self.event = threading.Event()

    def on_probe(self, address: str, in_flight: int, latency: float | None) -> None:
        self.answers.append((address, in_flight, latency))
        self.event.set()

    def on_probe_failed(self, address: str, unsupported: bool) -> None:
        self.failures.append((address, unsupported))
        self.event.set()


def ready_subconn(address: str) -> SubConn:
    sc = SubConn(Backend(address), grpc.insecure_channel(address), health=False)
    sc.state = READY
    return sc


def test_refuses_unknown_unusable_and_after_close():
    sink = Sink()
    sc = ready_subconn("127.0.0.1:1")
    subconns = {sc.address: sc}
    prober = SubConnProber(subconns.get, sink, 0.5)  # type: ignore[arg-type]
    try:
        assert prober.probe("127.0.0.1:2") is False  # not a backend of this channel
        sc.state = IDLE
        assert prober.probe(sc.address) is False  # not usable now
        sc.state = READY
        prober.close()
        assert prober.probe(sc.address) is False  # channel closing
        assert sink.answers == [] and sink.failures == []
    finally:
        sc.channel.close()


def test_answers_unimplemented_and_dead_backends(unique_key):
    plain = EchoServer("plain", with_health=False).start()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("s"), server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        scs = {a: ready_subconn(a) for a in (h.address, plain.address, "127.0.0.1:1")}
        sink = Sink()
        prober = SubConnProber(scs.get, sink, 2.0)  # type: ignore[arg-type]
        try:
            for address in scs:
                sink.event.clear()
                assert prober.probe(address) is True
                assert sink.event.wait(10), address
        finally:
            plain.server.stop(0)
            for sc in scs.values():
                sc.channel.close()
    assert sink.answers == [(h.address, 0, None)]  # in flight 0, no call ended yet: no latency estimate
    assert sink.failures == [(plain.address, True), ("127.0.0.1:1", False)]  # UNIMPLEMENTED; nothing listening
