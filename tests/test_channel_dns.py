"""dns targets: system resolver for IP literals and names, a DNS server in the target, periodic re-resolution."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest

pytest.importorskip("dns.message")  # dnspython: the "dns" extra (in the dev set)
import dns.message
import dns.rdatatype
import dns.rrset

import waypost
import waypost.resolver.dns as wdns
from tests.backends import echo_pb2, echo_pb2_grpc
from tests.backends.helpers import wait_until
from tests.backends.server import EchoServer

Req = echo_pb2.EchoRequest


class TinyDns:
    """A UDP DNS server on 127.0.0.1 answering A queries for one name from a mutable list."""

    def __init__(self, name: str) -> None:
        self.name = name.rstrip(".") + "."
        self.ips: list[str] = []
        self.queries = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                continue
            q = dns.message.from_wire(data)
            r = dns.message.make_response(q)
            qn = q.question[0]
            self.queries += 1
            if qn.name.to_text() == self.name and qn.rdtype == dns.rdatatype.A and self.ips:
                r.answer.append(dns.rrset.from_text_list(self.name, 1, "IN", "A", list(self.ips)))
            self.sock.sendto(r.to_wire(), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_ip_literal_target():
    srv = EchoServer("a").start()
    try:
        with waypost.dial(f"dns:///127.0.0.1:{srv.port}", balancer="round_robin") as ch:
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20).server == "a"
    finally:
        srv.stop(0)


async def test_system_resolver_resolves_localhost():
    r = wdns.DnsResolver(waypost.parse_target("dns:///localhost:8080"), None)
    addrs = await r.resolve()
    assert "127.0.0.1:8080" in addrs


def test_dns_server_in_target_and_periodic_re_resolution(monkeypatch):
    monkeypatch.setattr(wdns, "DEFAULT_INTERVAL", 0.2)
    a = EchoServer("a").start()
    port = a.port
    dns_srv = TinyDns("svc.test")
    dns_srv.ips = ["127.0.0.1"]
    second = None
    try:
        try:  # the second backend: same port, another loopback address
            second = EchoServer("b", port=port, bind_host="127.0.0.2").start()
        except RuntimeError:
            pytest.skip("cannot bind 127.0.0.2 here")
        target = f"dns://127.0.0.1:{dns_srv.port}/svc.test:{port}"
        with waypost.dial(target, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert stub.Unary(Req(), timeout=20).server == "a"
            dns_srv.ips = ["127.0.0.1", "127.0.0.2"]  # scale-up behind the name: picked up without failures
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20, what="re-resolved")
            assert {stub.Unary(Req()).server for _ in range(6)} == {"a", "b"}
            dns_srv.ips = ["127.0.0.2"]
            wait_until(lambda: [sc.address for sc in ch.balancer.subconns()] == [f"127.0.0.2:{port}"], 20)
            assert {stub.Unary(Req()).server for _ in range(4)} == {"b"}
    finally:
        dns_srv.close()
        a.stop(0)
        if second is not None:
            second.stop(0)


def test_unresolvable_name_fails_fast_naming_the_resolver_error(monkeypatch):
    monkeypatch.setattr(wdns, "DEFAULT_INTERVAL", 0.2)
    dns_srv = TinyDns("other.test")
    try:
        with waypost.dial(f"dns://127.0.0.1:{dns_srv.port}/missing.test:80", balancer="round_robin") as ch:
            wait_until(lambda: ch.balancer._resolver_error is not None, 20)
            with pytest.raises(grpc.RpcError) as ei:
                echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and "dns" in ei.value.details()
    finally:
        dns_srv.close()
