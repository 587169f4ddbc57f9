"""Balanced channels over registry targets: memory (in-process) and real etcd, with real gRPC servers."""

from __future__ import annotations

import itertools
import os

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from waypost.discovery import active_subscriptions

Req = echo_pb2.EchoRequest
_n = itertools.count()


def _servers_seen(stub, n: int = 12) -> set[str]:
    return {stub.Unary(Req(), timeout=20).server for _ in range(n)}


def _churn(registry, target: str, key: str) -> None:
    """Register a, dial, add b (gets traffic), stop a (loses traffic)."""
    with echo_servers("a", "b") as (a, b):
        pub_a = waypost.Publisher(registry, key, a.address)
        pub_a.start()
        pub_b = waypost.Publisher(registry, key, b.address)
        try:
            with waypost.dial(target, balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert _servers_seen(stub) == {"a"}  # first call on a fresh channel works
                pub_b.start()
                wait_until(lambda: _servers_seen(stub, 6) == {"a", "b"}, 30, what="new backend gets traffic")
                pub_a.stop()
                wait_until(lambda: [sc.address for sc in ch.balancer.subconns()] == [b.address], 30,
                           what="deregistered backend removed")
                assert _servers_seen(stub) == {"b"}
            # close() stopped the resolver: no shared watch on the key is left
            assert not any(key in s for s in active_subscriptions())
        finally:
            pub_a.stop()
            pub_b.stop()


def test_memory_target_follows_registrations():
    name = f"chan{os.getpid()}x{next(_n)}"
    registry = waypost.connect(f"memory://{name}")
    _churn(registry, f"memory://{name}/?key=greet.rpc", "greet.rpc")


def test_etcd_target_follows_registrations(shared_etcd, unique_key):
    registry = waypost.connect(shared_etcd.url())
    _churn(registry, f"etcd:///{shared_etcd.endpoint}?key={unique_key}", unique_key)


@pytest.mark.parametrize("form", ["discov", "legacy"])
def test_go_zero_target_forms_resolve(shared_etcd, unique_key, form):
    registry = waypost.connect(shared_etcd.url())
    target = (f"discov:///{shared_etcd.endpoint}?key={unique_key}" if form == "discov"
              else f"etcd://{shared_etcd.endpoint}/{unique_key}")
    with echo_servers("g") as (g,):
        pub = waypost.Publisher(registry, unique_key, g.address)
        pub.start()
        try:
            with waypost.dial(target) as ch:
                assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20).server == "g"
        finally:
            pub.stop()


def test_registry_target_without_backends_fails_fast_and_waits_with_wait_for_ready():
    name = f"chan{os.getpid()}x{next(_n)}"
    registry = waypost.connect(f"memory://{name}")
    with waypost.dial(f"memory://{name}/?key=empty.rpc", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(), timeout=20)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "nothing is registered under key 'empty.rpc'" in ei.value.details()
        with echo_servers("late") as (late,):
            fut = stub.Unary.future(Req(), timeout=30, wait_for_ready=True)
            pub = waypost.Publisher(registry, "empty.rpc", late.address)
            pub.start()
            try:
                assert fut.result(timeout=30).server == "late"
            finally:
                pub.stop()


def test_metadata_weight_reaches_the_policy():
    name = f"chan{os.getpid()}x{next(_n)}"
    registry = waypost.connect(f"memory://{name}")
    with echo_servers("heavy", "light") as (heavy, light):
        pubs = [waypost.Publisher(registry, "w.rpc", heavy.address, metadata={"weight": 30}),
                waypost.Publisher(registry, "w.rpc", light.address, metadata={"weight": 10})]
        for p in pubs:
            p.start()
        try:
            with waypost.dial(f"memory://{name}/?key=w.rpc", balancer="smooth_weighted_round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req()) and False, 30)
                got = [stub.Unary(Req()).server for _ in range(40)]
                assert got.count("heavy") == 30 and got.count("light") == 10
        finally:
            for p in pubs:
                p.stop()


def test_unreachable_registry_fails_at_dial():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(waypost.RegistryUnavailable):
        waypost.dial(f"etcd:///127.0.0.1:{port}?key=nobody.rpc")
