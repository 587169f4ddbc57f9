"""Several registries at once: serve(registry=[a, b]) registers in each, a client dials [target_a, target_b] and
uses the union. Two real etcd clusters, real gRPC servers, registries stopped and started with real signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer, EchoServicer
from harness.waiting import wait_until
from waypost.errors import InvalidTarget, RegistryUnavailable
from waypost.etcd.local import LocalEtcd, free_port
from waypost.registration.factory import MultiPublisher

Req = echo_pb2.EchoRequest


@pytest.fixture
def two_etcds() -> Iterator[tuple[LocalEtcd, LocalEtcd]]:
    a, b = LocalEtcd(), LocalEtcd()
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def keys(etcd: LocalEtcd, prefix: str) -> list[str]:
    out = etcd.etcdctl("get", "--prefix", "--keys-only", prefix)
    return [line for line in out.splitlines() if line]


def new_server(name: str) -> grpc.Server:
    s = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), s)
    return s


def test_serve_registers_in_each_registry_and_stop_removes_both(two_etcds, unique_key):
    a, b = two_etcds
    handle = waypost.serve(new_server("s"), unique_key, "127.0.0.1:0", registry=[a.url(), b.url()], ttl=5)
    try:
        pub = handle.publisher
        assert isinstance(pub, MultiPublisher) and pub.registered
        assert all(pub.status().values()) and len(pub.status()) == 2
        assert len(keys(a, unique_key + "/")) == 1 and len(keys(b, unique_key + "/")) == 1
        handle.pause()
        assert keys(a, unique_key + "/") == [] and keys(b, unique_key + "/") == []
        handle.resume()
        assert len(keys(a, unique_key + "/")) == 1 and len(keys(b, unique_key + "/")) == 1
    finally:
        handle.stop()
    assert keys(a, unique_key + "/") == [] and keys(b, unique_key + "/") == []


def test_one_registry_down_at_start_does_not_stop_the_other_and_is_registered_when_back(tmp_path, unique_key):
    up = LocalEtcd().start()
    port = free_port()
    down = LocalEtcd(base_dir=tmp_path / "down", client_ports=[port])  # not started yet
    try:
        handle = waypost.serve(new_server("s"), unique_key, "127.0.0.1:0", registry=[up.url(), down.url()], ttl=5,
                               register_timeout=2)
        try:
            assert handle.publisher.status() == {up.url(): True, down.url(): False}
            assert len(keys(up, unique_key + "/")) == 1
            down.start()
            wait_until(lambda: all(handle.publisher.status().values()), 20, what="registered in the late registry")
            assert len(keys(down, unique_key + "/")) == 1
        finally:
            handle.stop()
        assert keys(up, unique_key + "/") == [] and keys(down, unique_key + "/") == []
    finally:
        up.close()
        down.close()


def test_no_registry_reachable_fails_fast_naming_each(unique_key):
    dead = [f"etcd://127.0.0.1:{free_port()}", f"etcd://127.0.0.1:{free_port()}"]
    with pytest.raises(RegistryUnavailable) as e:
        waypost.serve(new_server("s"), unique_key, "127.0.0.1:0", registry=dead, register_timeout=1)
    assert "any of 2 registries" in str(e.value) and all(u.removeprefix("etcd://") in str(e.value) for u in dead)


def test_dial_a_list_of_targets_uses_the_union_and_keeps_a_lost_sources_list(two_etcds, unique_key):
    a, b = two_etcds
    servers = {n: EchoServer(n) for n in ("only-a", "only-b", "both")}
    for s in servers.values():
        s.start()
    try:
        reg_a, reg_b = waypost.connect(a.url()), waypost.connect(b.url())
        pubs = [waypost.Publisher(reg_a, unique_key, servers["only-a"].address, ttl=5),
                waypost.Publisher(reg_b, unique_key, servers["only-b"].address, ttl=5),
                waypost.Publisher(reg_a, unique_key, servers["both"].address, ttl=5, metadata={"from": "a"}),
                waypost.Publisher(reg_b, unique_key, servers["both"].address, ttl=5, metadata={"from": "b"})]
        for p in pubs:
            p.start()
        targets = [f"etcd:///{a.endpoint}?key={unique_key}", f"etcd:///{b.endpoint}?key={unique_key}"]
        with waypost.dial(targets, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.subconns()) == 3, 10, what="the union of both registries")
            both = [sc for sc in ch.balancer.subconns() if sc.address == servers["both"].address]
            assert len(both) == 1 and dict(both[0].backend.metadata) == {"from": "a"}  # the first source's
            # round_robin picks among READY connections only: 12 calls reach all three once all three are READY
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 3, 20, what="all three READY")
            assert {stub.Unary(Req(), timeout=5).server for _ in range(12)} == set(servers)
            # registry a dies: its last list is kept, calls go on to every backend, none fails
            a.members[0].kill()
            failed = 0
            for _ in range(60):
                try:
                    stub.Unary(Req(), timeout=5)
                except grpc.RpcError:
                    failed += 1
            assert failed == 0
            assert len(ch.balancer.subconns()) == 3
        for p in pubs:
            p.stop()
    finally:
        for s in servers.values():
            s.stop()


def test_a_list_of_targets_is_validated_target_by_target():
    with pytest.raises(InvalidTarget, match="target 2 of 2"):
        waypost.dial(["direct:///127.0.0.1:1", "etcd:///127.0.0.1:2379"])  # the second has no key
    with pytest.raises(InvalidTarget, match="empty list"):
        waypost.dial([])


def test_chaos_one_of_two_registries_down_under_load(two_etcds, unique_key):
    """The chaos scenario (bench/chaos_report.py runs it too): registry a down for a while under load: 0 failed
    calls, and the server's registration in a is complete again soon after a returns."""
    a, b = two_etcds
    handle = waypost.serve(new_server("s"), unique_key, "127.0.0.1:0", registry=[a.url(), b.url()], ttl=2)
    targets = [f"etcd:///{a.endpoint}?key={unique_key}", f"etcd:///{b.endpoint}?key={unique_key}"]
    stop = threading.Event()
    sent, failed = [0], []
    try:
        with waypost.dial(targets) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            stub.Unary(Req(), timeout=5)

            def load() -> None:
                deadline = time.monotonic() + 60
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        stub.Unary(Req(), timeout=5)
                    except grpc.RpcError as e:
                        failed.append(e.code())
                    sent[0] += 1

            t = threading.Thread(target=load, daemon=True)
            t.start()
            a.members[0].kill()
            time.sleep(3)  # longer than the ttl: the lease in a expires meanwhile
            a.members[0].start()
            back = time.monotonic()
            wait_until(lambda: len(keys(a, unique_key + "/")) == 1, 20, what="registered in a again")
            recovered = time.monotonic() - back
            stop.set()
            t.join(10)
            assert sent[0] > 50 and not failed, (sent[0], failed[:3])
            print(f"registration back in a {recovered:.2f}s after it returned; {sent[0]} calls, 0 failed")
    finally:
        stop.set()
        handle.stop()


def test_aio_dial_a_list_of_targets():
    import asyncio

    import waypost.aio

    servers = [EchoServer("x"), EchoServer("y")]
    for s in servers:
        s.start()
    try:
        async def main() -> set[str]:
            targets = [f"direct:///{servers[0].address}", f"direct:///{servers[1].address},{servers[0].address}"]
            async with waypost.aio.dial(targets, balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                got: set[str] = set()
                deadline = time.monotonic() + 10  # round robin over the READY ones: y may still be connecting
                while got != {"x", "y"} and time.monotonic() < deadline:
                    got.add((await stub.Unary(Req(), timeout=5, wait_for_ready=True)).server)
                assert len(ch.balancer.subconns()) == 2  # x is in both sources: one backend
                return got

        assert asyncio.run(main()) == {"x", "y"}
    finally:
        for s in servers:
            s.stop()


def test_serve_in_etcd_consul_and_zookeeper_at_once_and_dial_all_three(shared_etcd, tmp_path, unique_key):
    """One server in three kinds of registry, one channel reading the three: make_publisher picks each kind, the
    union is one backend; a graceful stop leaves nothing in any of them."""
    from harness import consul_agent
    from tests.zookeeper import support as zk_support

    for why in (consul_agent.skip_reason(), zk_support.skip_reason()):
        if why:
            pytest.skip(why)
    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_agent.consul_binary()) as agent:
        zk = zk_support.ZkServer().start()
        try:
            service = unique_key.replace(".", "-")
            registries = [shared_etcd.url(), agent.url, f"zk://{zk.hosts}"]
            handle = waypost.serve(new_server("s"), service, "127.0.0.1:0", registry=registries, ttl=5)
            try:
                # serve() waited for every registry up to 1 s past the first; a loaded machine may need longer
                wait_until(lambda: list(handle.publisher.status().values()) == [True, True, True], 10,
                           what="registered in the three registries")
                assert agent.passing_addresses(service) == [handle.address]
                targets = [f"etcd:///{shared_etcd.endpoint}?key={service}",
                           f"consul://{agent.address}/{service}", f"zk://{zk.hosts}/{service}"]
                with waypost.dial(targets) as ch:
                    assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=5).server == "s"
                    assert [sc.address for sc in ch.balancer.subconns()] == [handle.address]
                    # the dial returned with the first source that answered; the others follow
                    wait_until(lambda: ch._resolver.source_lists() == [[handle.address]] * 3, 10,
                               what="every source lists the server")
            finally:
                handle.stop()
            assert keys(shared_etcd, service + "/") == [] and agent.passing_addresses(service) == []
        finally:
            zk.close()


def test_publisher_gauges_have_one_series_per_registry(two_etcds, unique_key):
    from prometheus_client import CollectorRegistry

    from waypost import metrics

    a, b = two_etcds
    prom = CollectorRegistry()
    metrics.enable(prom)
    try:
        handle = waypost.serve(new_server("s"), unique_key, "127.0.0.1:0", registry=[a.url(), b.url()], ttl=5)
        try:
            for url in (a.url(), b.url()):
                assert prom.get_sample_value("waypost_publisher_registered",
                                             {"key": unique_key, "registry": url}) == 1
            handle.pause()
            assert prom.get_sample_value("waypost_publisher_registered",
                                         {"key": unique_key, "registry": a.url()}) == 0
        finally:
            handle.stop()
    finally:
        metrics.disable()


def test_update_metadata_is_validated_for_every_registry_before_any_is_written(shared_etcd, tmp_path, unique_key):
    """Metadata that one registry cannot carry (Consul: a value over 512 characters, a key with a space) or that
    JSON cannot carry is refused by ``update_metadata`` with the error ``serve()`` gives for it, and written
    nowhere: the registries never disagree."""
    from harness import consul_agent

    if why := consul_agent.skip_reason():
        pytest.skip(why)
    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_agent.consul_binary()) as agent:
        service = unique_key.replace(".", "-")
        registries = [shared_etcd.url(), agent.url]
        bad: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"desc": "x" * 600}, ValueError), ({"bad key": 1}, ValueError), ({"when": object()}, TypeError)]
        for md, error in bad:  # what serve() says of each
            with pytest.raises(error) as at_serve:
                waypost.serve(new_server("s"), service, "127.0.0.1:0", registry=registries, metadata=md)
            assert str(at_serve.value)
        handle = waypost.serve(new_server("s"), service, "127.0.0.1:0", registry=registries, ttl=5,
                               metadata={"weight": 1})
        try:
            wait_until(lambda: list(handle.publisher.status().values()) == [True, True], 10,
                       what="registered in both registries")
            def etcd_records() -> str:  # the address record and waypost's metadata side record
                return "".join(shared_etcd.etcdctl("get", "--prefix", p) for p in (service + "/", "_waypost/meta/"))

            before = etcd_records()
            assert '"weight":1' in before.replace(" ", "")
            for md, error in bad:
                with pytest.raises(error) as at_update:
                    handle.update_metadata(md)
                with pytest.raises(error) as at_serve:
                    waypost.serve(new_server("s"), service, "127.0.0.1:0", registry=registries, metadata=md)
                assert str(at_update.value) == str(at_serve.value)
            assert etcd_records() == before  # nothing written
            handle.update_metadata({"weight": 7})  # a good one reaches both
            wait_until(lambda: '"weight":7' in etcd_records().replace(" ", ""), 10, what="etcd has the new weight")
            wait_until(lambda: agent.health(service)[0]["Service"]["Meta"].get("weight") == "7", 10,
                       what="Consul has the new weight")
        finally:
            handle.stop()
