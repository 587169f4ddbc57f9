"""dns targets through waypost.dial: real gRPC backends on 127.0.0.x behind names served by a real dnsmasq,
records changed while the client runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import waypost
import waypost.aio
import waypost.registries.dns.discovery as wdns
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.dns.support import Dnsmasq, dnsmasq  # noqa: F401  (fixture)

pytest.importorskip("dns.resolver")  # dnspython: the "dns" extra (in the dev set)

Req = echo_pb2.EchoRequest

#: Re-resolve every 300 ms (the TTL of 1 s is clamped to it), retry fast, time out fast.
FAST = [(wdns.INTERVAL_OPTION, 300), (wdns.MIN_INTERVAL_OPTION, 100), (wdns.TIMEOUT_OPTION, 300)]


def _start_trio() -> dict[str, EchoServer] | None:
    started: dict[str, EchoServer] = {"a": EchoServer("a").start()}
    try:
        for name, host in (("b", "127.0.0.2"), ("c", "127.0.0.3")):
            started[name] = EchoServer(name, port=started["a"].port, bind_host=host).start()
    except RuntimeError:  # that port is taken on 127.0.0.2/3 (another test run): try another one
        for s in started.values():
            s.stop(0)
        return None
    return started


@pytest.fixture
def backends() -> Iterator[dict[str, EchoServer]]:
    """Echo servers named a, b, c on 127.0.0.1, 127.0.0.2, 127.0.0.3, all on the same port."""
    started = None
    for _ in range(5):
        started = _start_trio()
        if started is not None:
            break
    if started is None:
        pytest.skip("cannot bind one port on 127.0.0.1-3 (Linux routes 127.0.0.0/8 to lo; this system does not?)")
    try:
        yield started
    finally:
        for s in started.values():
            s.stop(0)


def servers_hit(stub: echo_pb2_grpc.EchoStub, n: int) -> set[str]:
    return {stub.Unary(Req(), timeout=20).server for _ in range(n)}


def test_ip_literal_target():
    srv = EchoServer("a").start()
    try:
        with waypost.dial(f"dns:///127.0.0.1:{srv.port}", balancer="round_robin") as ch:
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20).server == "a"
    finally:
        srv.stop(0)


def test_system_resolver_resolves_localhost():
    srv = EchoServer("a").start()
    try:
        with waypost.dial(f"dns:///localhost:{srv.port}", balancer="round_robin") as ch:
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20).server == "a"
    finally:
        srv.stop(0)


def test_added_address_gets_traffic_and_removed_one_stops(dnsmasq: Dnsmasq, backends):  # noqa: F811
    port = backends["a"].port
    dnsmasq.set({"svc.test": ["127.0.0.1"]})
    with waypost.dial(dnsmasq.target("svc.test", port), balancer="round_robin", options=FAST) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert servers_hit(stub, 3) == {"a"}
        dnsmasq.set({"svc.test": ["127.0.0.1", "127.0.0.2", "127.0.0.3"]})  # scale-up: no failure needed
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3, what="scale-up picked up")
        assert servers_hit(stub, 9) == {"a", "b", "c"}
        dnsmasq.set({"svc.test": ["127.0.0.3"]})  # scale-down
        wait_until(lambda: [sc.address for sc in ch.balancer.subconns()] == [f"127.0.0.3:{port}"],
                   what="scale-down picked up")
        before = {n: s.servicer.calls for n, s in backends.items()}
        assert servers_hit(stub, 6) == {"c"}
        after = {n: s.servicer.calls for n, s in backends.items()}
        assert (after["a"], after["b"]) == (before["a"], before["b"])


def test_nxdomain_at_start_fails_calls_with_unavailable_naming_the_host(dnsmasq: Dnsmasq):  # noqa: F811
    srv = EchoServer("late").start()
    try:
        with waypost.dial(dnsmasq.target("late.test", srv.port), balancer="round_robin", options=FAST) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            with pytest.raises(grpc.RpcError) as ei:
                stub.Unary(Req(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "late.test does not exist (NXDOMAIN" in ei.value.details()
            # the name appears later: the same channel recovers (lookups are retried)
            dnsmasq.set({"late.test": ["127.0.0.1"]})
            wait_until(lambda: ch.balancer.ready_addresses() == [srv.address], what="name resolved")
            assert stub.Unary(Req(), timeout=20).server == "late"
    finally:
        srv.stop(0)


def test_system_resolver_unknown_name_fails_calls_naming_the_host():
    with waypost.dial("dns:///no-such-host.invalid:80", balancer="round_robin") as ch:
        with pytest.raises(grpc.RpcError) as ei:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot resolve no-such-host.invalid" in ei.value.details()


def test_dns_server_down_keeps_the_last_good_set(dnsmasq: Dnsmasq, backends):  # noqa: F811
    port = backends["a"].port
    dnsmasq.set({"svc.test": ["127.0.0.1", "127.0.0.2"]})
    with waypost.dial(dnsmasq.target("svc.test", port), balancer="round_robin", options=FAST) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2)
        dnsmasq.stop()
        wait_until(lambda: ch.balancer.resolver_error_message is not None, what="lookup failure seen")
        assert "timed out" in ch.balancer.resolver_error_message
        assert servers_hit(stub, 6) == {"a", "b"}  # still served by the last good set
        assert sorted(sc.address for sc in ch.balancer.subconns()) == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]
        dnsmasq.set({"svc.test": ["127.0.0.3"]})
        dnsmasq.start()  # back (same port) with new records: picked up on the next retry
        wait_until(lambda: ch.balancer.ready_addresses() == [f"127.0.0.3:{port}"], what="recovery")
        assert servers_hit(stub, 3) == {"c"}


def test_backend_connection_failure_triggers_re_resolution(tmp_path: Path, backends):
    # TTL 300 s and interval 60 s: no periodic lookup happens during the test; only the failure can
    # make the channel notice the new record.
    d = Dnsmasq(tmp_path, ttl=300)
    port = backends["a"].port
    d.set({"svc.test": ["127.0.0.1", "127.0.0.2"]})
    d.start()
    opts = [(wdns.INTERVAL_OPTION, 60_000), (wdns.MIN_INTERVAL_OPTION, 200)]
    try:
        with waypost.dial(d.target("svc.test", port), balancer="round_robin", options=opts) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2)
            d.set({"svc.test": ["127.0.0.1", "127.0.0.3"]})  # b is replaced by c behind the name
            backends["b"].stop(0)  # ... and b goes away: its connection fails
            wait_until(lambda: f"127.0.0.3:{port}" in ch.balancer.ready_addresses(),
                       what="re-resolved after the connection failure")
            assert f"127.0.0.2:{port}" not in [sc.address for sc in ch.balancer.subconns()]
            assert servers_hit(stub, 6) == {"a", "c"}
    finally:
        d.stop()


async def test_aio_channel_follows_record_changes(dnsmasq: Dnsmasq, backends):  # noqa: F811
    port = backends["a"].port
    dnsmasq.set({"svc.test": ["127.0.0.1"]})
    async with waypost.aio.dial(dnsmasq.target("svc.test", port), balancer="round_robin", options=FAST) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert (await stub.Unary(Req(), timeout=20)).server == "a"
        await asyncio.to_thread(dnsmasq.set, {"svc.test": ["127.0.0.2"]})
        for _ in range(2000):  # up to ~20 s
            if ch.balancer.ready_addresses() == [f"127.0.0.2:{port}"]:
                break
            await asyncio.sleep(0.01)
        assert ch.balancer.ready_addresses() == [f"127.0.0.2:{port}"]
        assert (await stub.Unary(Req(), timeout=20)).server == "b"
