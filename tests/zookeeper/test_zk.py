"""ZooKeeper: the zk kind (ZkPublisher, the generic resolver over ZkDiscovery) against a real ZooKeeper 3.9.5 (tests/zookeeper/support.py), in Kratos' layout.

The "other client" is a plain kazoo client (what a Kratos service's go-zookeeper connection would see and write).
Every server and proxy listens on 127.0.0.1; every wait is bounded (harness.waiting).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import waypost
import waypost.resolver
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.tcp_proxy import TcpProxy
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.resolver.updates import ResolverUpdates
from tests.zookeeper import support as zk_support
from waypost.errors import InvalidTarget, RegistryUnavailable
from waypost.etcd.local import free_port
from waypost.registries.zookeeper import layout
from waypost.registries.zookeeper.client import SessionLog
from waypost.registries.zookeeper.config import ZkConfig, from_target, parse_registry_url
from waypost.resolver import resolver_factory
from waypost.resolver.base import ResolverOptions
from waypost.resolver.target import parse_target
from waypost.types import Backend

pytestmark = [pytest.mark.skipif(zk_support.skip_reason() is not None, reason=str(zk_support.skip_reason())),
              zk_support.timeout_mark()]

if zk_support.skip_reason() is None:
    from waypost.registries.zookeeper.registrar import ZkPublisher

_n = itertools.count()


def _service() -> str:
    return f"svc{next(_n)}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def server() -> Iterator[zk_support.ZkServer]:
    """One ZooKeeper for the tests that do not disturb it (each uses its own service name)."""
    s = zk_support.ZkServer().start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def own_server() -> Iterator[zk_support.ZkServer]:
    """A ZooKeeper of the test's own (restarted by it)."""
    s = zk_support.ZkServer().start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def plain(server) -> Iterator[Any]:
    """A plain kazoo client: the view (and the writes) of another ZooKeeper user, e.g. a Kratos service."""
    yield from _plain(server)


def _plain(server: zk_support.ZkServer) -> Iterator[Any]:
    from kazoo.client import KazooClient

    c = KazooClient(hosts=server.hosts, timeout=10)
    c.start(timeout=10)
    try:
        yield c
    finally:
        c.stop()
        c.close()


Pushes = ResolverUpdates


def _resolver(hosts: str, service: str, pushes: Pushes, **kw: Any) -> Any:
    r = resolver_factory("zk")(parse_target(f"zk://{hosts}/{service}"), kw.pop("options", None), **kw)
    r.start(pushes.update, pushes.error)
    return r


def _path(pub: Any) -> str:
    return f"/microservices/{pub.base_key}/{pub.instance_id}"


def _sessions(server: zk_support.ZkServer) -> set[int]:
    """The session ids of the server's client connections (the ``cons`` four-letter word)."""
    return {int(m, 16) for m in re.findall(r"sid=0x([0-9a-f]+)", zk_support.four_letter(server.port, b"cons"))}


def _watched(server: zk_support.ZkServer, session: int) -> set[str]:
    """The paths ``session`` has a watch on, as the server counts them (the ``wchc`` four-letter word)."""
    watched: dict[int, set[str]] = {}
    for line in zk_support.four_letter(server.port, b"wchc").splitlines():
        if line.startswith("0x"):
            current = watched.setdefault(int(line, 16), set())
        elif line.strip():
            current.add(line.strip())
    return watched.get(session, set())


def _kratos_instance(id: str, name: str, endpoints: list[str], metadata: dict[str, str] | None = None,
                     version: str = "") -> bytes:
    """What Kratos' json.Marshal of a ServiceInstance writes (struct field order, compact)."""
    return json.dumps({"id": id, "name": name, "version": version, "metadata": metadata, "endpoints": endpoints},
                      separators=(",", ":")).encode()


# ---- settings and layout (no server) --------------------------------------------------------------------


def test_registry_urls_and_targets():
    cfg = parse_registry_url("zk://10.0.0.1,10.0.0.2:2182,[::1]")
    assert cfg.hosts == ("10.0.0.1:2181", "10.0.0.2:2182", "[::1]:2181")
    assert cfg.session_timeout is None and cfg.namespace == "/microservices"
    assert cfg.connect_string == "10.0.0.1:2181,10.0.0.2:2182,[::1]:2181"
    cfg = parse_registry_url("ZK://h:1/?session_timeout=4.5&namespace=/services/")
    assert (cfg.session_timeout, cfg.namespace, cfg.url) == (4.5, "/services",
                                                             "zk://h:1?session_timeout=4.5&namespace=/services")
    for bad, says in [("zk://", "no host"), ("zk://h:2181/greet", "names the ZooKeeper hosts only"),
                      ("zk://u:p@h:2181", "no credentials"), ("zk://h:99999", "bad port"),
                      ("zk://h?session_timeout=0", "between 0 and 3600"), ("zk://h?ttl=3", "unknown option 'ttl'"),
                      ("zk://h?namespace=rel", "absolute"), ("zk://h?namespace=/zookeeper/x", "server's own"),
                      ("etcd://h:2379", "starts with zk://")]:
        with pytest.raises(InvalidTarget, match=says):
            parse_registry_url(bad)
    cfg = from_target(parse_target("zk://h1,h2:2182/greet"))
    assert cfg == ZkConfig(hosts=("h1:2181", "h2:2182"))
    with pytest.raises(InvalidTarget):
        from_target(parse_target("consul://h:8500/greet"))
    assert layout.instance_path("/microservices", "greet", "id-1") == "/microservices/greet/id-1"
    assert layout.instance_path("/", "greet", "id-1") == "/greet/id-1"  # Go's path.Join
    for name in ("", "a/b", ".", "..", "a\x00b", "a\x1fb", "\ud800", "\U0001f600"):
        with pytest.raises(layout.LayoutError):
            layout.check_node_name(name)
    with pytest.raises(ValueError, match="cannot contain '/'"):
        ZkPublisher("zk://127.0.0.1:1", "a/b", "127.0.0.1:5000")
    with pytest.raises(ValueError, match="wildcard"):
        ZkPublisher("zk://127.0.0.1:1", "greet", "0.0.0.0:5000")


# ---- the publisher's node ------------------------------------------------------------------------------------


def test_publisher_node_is_kratos_layout_and_stop_deletes_it(server, plain):
    service = _service()
    pub = ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7001", id="inst-1",
                      metadata={"version": "v1.2", "zone": "a", "weight": 5})
    pub.start()
    try:
        path = f"/microservices/{service}/inst-1"
        assert (_path(pub), pub.registered, pub.lease_id, pub.registrations) == (path, True, None, 1)
        # the parents: persistent, empty data (as Kratos' ensureName creates them)
        for parent in ("/microservices", f"/microservices/{service}"):
            data, stat = plain.get(parent)
            assert (data, stat.ephemeralOwner) == (b"", 0)
        data, stat = plain.get(path)
        assert stat.ephemeralOwner == pub.client.session_id != 0  # EPHEMERAL, of the publisher's session
        # byte for byte what Go's json.Marshal(registry.ServiceInstance) writes
        assert data == (b'{"id":"inst-1","name":"' + service.encode() + b'","version":"v1.2",'
                        b'"metadata":{"weight":"5","zone":"a"},"endpoints":["grpc://127.0.0.1:7001"]}')
        assert list(json.loads(data)) == ["id", "name", "version", "metadata", "endpoints"]
        # no metadata: "metadata":null; no id: one made of the service and the address (stable across restarts)
        bare = ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7002").start()
        try:
            assert bare.instance_id == f"{service}-127.0.0.1-7002"
            data, _ = plain.get(_path(bare))
            assert data == (b'{"id":"' + bare.instance_id.encode() + b'","name":"' + service.encode() +
                            b'","version":"","metadata":null,"endpoints":["grpc://127.0.0.1:7002"]}')
            assert sorted(plain.get_children(f"/microservices/{service}")) == sorted(["inst-1", bare.instance_id])
        finally:
            bare.stop()
        session = pub.client.session_id
        assert session in _sessions(server)
        pub.stop()
        assert plain.exists(path) is None  # deleted at once, not left to the session's expiry
        assert (pub.key, pub.registered) == (None, False)
        wait_until(lambda: session not in _sessions(server), 5, what="the session closed")
        pub.stop()  # idempotent
    finally:
        pub.stop()


def test_node_deleted_from_outside_is_created_again_at_once(server, plain):
    """The guard's watch sees the delete: the node is back long before the first renewal check (ttl/3 = 10 s),
    and again when another session takes the path."""
    service = _service()
    with ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7010", id="me", ttl=30) as pub:
        path = _path(pub)
        session = pub.client.session_id
        ours = plain.get(path)[0]
        started = time.monotonic()
        plain.delete(path)
        stat = wait_until(lambda: plain.exists(path), 5, what="the node created again before any renewal")
        recreated = time.monotonic() - started
        assert stat.ephemeralOwner == session  # in the same session
        wait_until(lambda: pub.registrations == 2 and pub.registered and pub.outage.since is None, 5,
                   what="registered again")
        assert pub.renewals == 0  # the guard did it, not a renewal
        # another session takes the path (deletes ours, writes its own): ours again at once
        taking = plain.transaction()
        taking.delete(path)
        taking.create(path, b"theirs", ephemeral=True)
        assert taking.commit() == [True, path]
        wait_until(lambda: plain.exists(path).ephemeralOwner == session, 5, what="our node back")
        wait_until(lambda: pub.registrations == 3 and pub.registered, 5, what="registered again")
        assert (plain.get(path)[0], pub.renewals) == (ours, 0)
    with ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7010", id="me", ttl=3) as pub:
        # someone rewrites the data: ours is put back at the next renewal check (ttl/3 s)
        plain.set(path, b"garbage")
        wait_until(lambda: plain.get(path)[0] == ours, 10, what="our data put back")
        assert pub.client.writes == 1
    print(f"re-created {recreated * 1000:.0f} ms after an outside delete (ttl 30 s: first renewal at 10 s)")


def test_a_stale_node_of_another_session_is_replaced(server, plain):
    service = _service()
    path = f"/microservices/{service}/same-id"
    plain.create(path, b"old incarnation", ephemeral=True, makepath=True)
    with ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7011", id="same-id") as pub:
        data, stat = plain.get(path)
        assert stat.ephemeralOwner == pub.client.session_id != plain.client_id[0]
        assert json.loads(data)["endpoints"] == ["grpc://127.0.0.1:7011"]


def test_two_live_instances_with_one_id_do_not_fight_at_network_speed(server, plain):
    """A node of another session at our path is replaced once (a previous incarnation); when that session puts
    it back, it is live: the start fails naming the shared id, or (when our create won) the take-overs slow
    down to one per TAKEOVER_PAUSE s instead of running at network speed."""
    service = _service()
    url = f"zk://{server.hosts}"
    first = ZkPublisher(url, service, "127.0.0.1:7012", id="dup").start()
    second = ZkPublisher(url, service, "127.0.0.1:7013", id="dup")
    try:
        try:
            second.start()
        except RegistryUnavailable as e:
            assert "do two running instances share this id?" in str(e)
        time.sleep(2.0)
        creations = sum(p.registrations for p in (first, second))
        assert creations <= 4, creations
        assert plain.exists(_path(first)) is not None
    finally:
        second.stop()
        first.stop()


def test_pause_resume_and_update_metadata_is_one_change(server, plain):
    service = _service()
    pushes = Pushes()
    pub = ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7020", metadata={"weight": 10}).start()
    r = _resolver(server.hosts, service, pushes)
    try:
        assert pushes.last == [Backend("127.0.0.1:7020", {"weight": "10"})]
        before = len(pushes.lists)
        pub.update_metadata({"weight": 3})
        wait_until(lambda: pushes.last == [Backend("127.0.0.1:7020", {"weight": "3"})], 10,
                   what="the new metadata pushed")
        time.sleep(0.3)  # nothing else follows
        assert pushes.lists[before:] == [[Backend("127.0.0.1:7020", {"weight": "3"})]]  # one change, no removal
        assert plain.get(_path(pub))[1].version == 1  # one setData
        assert pub.client.writes == 1
        session = pub.client.session_id
        wait_until(lambda: _watched(server, session) == {_path(pub)}, 5,
                   what="the guard's watch, set again after our own setData")
        pub.pause()
        assert plain.exists(_path(pub)) is None and not pub.registered
        assert _watched(server, session) == set()  # the guard ended with the registration, leaving no watch
        wait_until(lambda: pushes.last == [], 10, what="paused backend removed")
        pub.update_metadata({"weight": 4})  # while paused: carried by the next registration
        pub.resume()
        assert pub.registered and pub.registrations == 2
        assert json.loads(plain.get(_path(pub))[0])["metadata"] == {"weight": "4"}
        wait_until(lambda: _watched(server, session) == {_path(pub)}, 5, what="the guard watching again")
        wait_until(lambda: pushes.last == [Backend("127.0.0.1:7020", {"weight": "4"})], 10, what="resumed")
    finally:
        r.close()
        pub.stop()


# ---- the resolver ----------------------------------------------------------------------------------------------


def test_resolver_discovers_instances_written_in_kratos_layout(server, plain):
    service = _service()
    base = f"/microservices/{service}"
    # a Kratos gRPC + HTTP server, as Kratos' Register writes it
    plain.create(f"{base}/k1", _kratos_instance("k1", service, ["http://127.0.0.1:8000", "grpc://127.0.0.1:9000"],
                                                {"region": "eu"}, "v2"), ephemeral=True, makepath=True)
    plain.create(f"{base}/http-only", _kratos_instance("http-only", service, ["http://127.0.0.1:8001"]),
                 ephemeral=True)
    plain.create(f"{base}/other", _kratos_instance("other", "another-service", ["grpc://127.0.0.1:9009"]),
                 ephemeral=True)
    plain.create(f"{base}/junk", b"not json", ephemeral=True)
    pushes = Pushes()
    r = _resolver(server.hosts, service, pushes)
    try:
        # only the grpc:// endpoint of the instance named like the service; version joins the metadata
        assert pushes.last == [Backend("127.0.0.1:9000", {"region": "eu", "version": "v2"})]
        plain.create(f"{base}/k2", _kratos_instance("k2", service, ["grpc://127.0.0.1:9001"]), ephemeral=True)
        wait_until(lambda: pushes.addresses() == ["127.0.0.1:9000", "127.0.0.1:9001"], 10, what="k2 added")
        plain.set(f"{base}/k2", _kratos_instance("k2", service, ["grpc://127.0.0.1:9001"], {"weight": "2"}))
        wait_until(lambda: pushes.last and pushes.last[1].metadata == {"weight": "2"}, 10, what="k2 changed")
        plain.delete(f"{base}/k1")
        wait_until(lambda: pushes.addresses() == ["127.0.0.1:9001"], 10, what="k1 removed")
        assert all(pushes.lists)  # never an empty list on the way
    finally:
        r.close()


def test_resolver_waits_for_a_service_that_does_not_exist_yet(server, plain):
    service = _service()
    pushes = Pushes()
    r = _resolver(server.hosts, service, pushes)
    try:
        assert pushes.last == []
        plain.create(f"/microservices/{service}/x", _kratos_instance("x", service, ["grpc://127.0.0.1:9100"]),
                     ephemeral=True, makepath=True)
        wait_until(lambda: pushes.addresses() == ["127.0.0.1:9100"], 10, what="instance of a new service")
    finally:
        r.close()


def test_unreachable_zookeeper_fails_fast_naming_why():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="connection refused") as err:
        ZkPublisher(f"zk://127.0.0.1:{port}", "greet", "127.0.0.1:7030", timeout=1.0).start()
    assert time.monotonic() - started < 3.0
    assert f"127.0.0.1:{port}" in str(err.value)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="connection refused"):
        _resolver(f"127.0.0.1:{port}", "greet", Pushes(), timeout=1.0)
    assert time.monotonic() - started < 3.0
    # non-blocking start (aio dial): returns at once, reports the reason early through on_error
    pushes = Pushes()
    started = time.monotonic()
    r = _resolver(f"127.0.0.1:{port}", "greet", pushes, timeout=1.0, options=ResolverOptions(blocking=False))
    try:
        assert time.monotonic() - started < 0.5
        wait_until(lambda: any("connection refused" in e for e in pushes.errors), 5, what="early error")
        assert pushes.last is None
    finally:
        r.close()


# ---- faults ---------------------------------------------------------------------------------------------------


def test_session_expiry_creates_the_node_again(own_server):
    """A partition between publisher and ZooKeeper longer than the session: the server expires the session and
    deletes the node; once the link is back the publisher gets a new session and creates the node again. A
    resolver on the other side of the partition sees the instance go and come back."""
    proxy = TcpProxy(("127.0.0.1", own_server.port))
    service = _service()
    pushes = Pushes()
    gen = _plain(own_server)
    plain = next(gen)
    pub = ZkPublisher(f"zk://{proxy.endpoint}?session_timeout=2", service, "127.0.0.1:7040", id="p").start()
    r = _resolver(own_server.hosts, service, pushes)
    try:
        old = pub.client.session_id
        assert pushes.addresses() == ["127.0.0.1:7040"]
        cut = time.monotonic()
        proxy.cut()
        wait_until(lambda: plain.exists(_path(pub)) is None, 10, what="the server expired the session")
        gone = time.monotonic() - cut
        wait_until(lambda: not pub.registered and pub.outage.since is not None, 5, what="publisher knows")
        wait_until(lambda: pushes.addresses() == [], 5, what="resolver saw the instance go")
        time.sleep(0.5)
        restored = time.monotonic()
        proxy.restore()
        stat = wait_until(lambda: plain.exists(_path(pub)), 15, what="the node created again")
        back = time.monotonic() - restored
        assert stat.ephemeralOwner != old
        wait_until(lambda: pub.registered and pub.client.session_id == stat.ephemeralOwner, 5,
                   what="registered again")
        assert pub.registrations == 2 and pub.outage.since is None
        wait_until(lambda: pushes.addresses() == ["127.0.0.1:7040"], 10, what="resolver saw it back")
        print(f"node gone {gone:.2f} s after the cut (session 2 s); created again {back:.2f} s after the link "
              "came back")
    finally:
        r.close()
        pub.stop()
        proxy.close()
        gen.close()


def test_server_restart_keeps_the_list_then_resumes(own_server):
    service = _service()
    pushes = Pushes()
    a = ZkPublisher(f"zk://{own_server.hosts}", service, "127.0.0.1:7050", id="a").start()
    r = _resolver(own_server.hosts, service, pushes)
    try:
        assert pushes.addresses() == ["127.0.0.1:7050"]
        session = a.client.session_id
        own_server.stop()
        wait_until(lambda: pushes.errors, 10, what="the resolver reports the lost connection")
        time.sleep(1.0)
        assert pushes.addresses() == ["127.0.0.1:7050"]  # the last list is kept
        restarted = time.monotonic()
        own_server.start()
        # sessions survive a restart (ZooKeeper keeps them in its data dir): same session, same node
        wait_until(lambda: a.registered and a.client.session_id is not None and r.discovery.connected
                   and r.discovery.loads >= 2, 15, what="reconnected and read again")
        reconnected = time.monotonic() - restarted
        assert a.client.session_id == session and a.registrations == 1
        # the guard set its watch again once reconnected (kazoo drops watches on a disconnection)
        wait_until(lambda: _watched(own_server, session) == {_path(a)}, 10, what="the guard watching again")
        assert a.registrations == 1  # a disconnection is not a lost node
        b = ZkPublisher(f"zk://{own_server.hosts}", service, "127.0.0.1:7051", id="b").start()
        try:
            wait_until(lambda: pushes.addresses() == ["127.0.0.1:7050", "127.0.0.1:7051"], 10,
                       what="watching resumed after the restart")
        finally:
            b.stop()
        wait_until(lambda: pushes.addresses() == ["127.0.0.1:7050"], 10, what="b gone")
        assert all(pushes.lists)  # the kept instance was never removed on the way
        print(f"server start {own_server.startup_seconds[-1]:.2f} s; resolver and publisher back "
              f"{reconnected:.2f} s after the restart began")
    finally:
        r.close()
        a.stop()


# ---- end to end --------------------------------------------------------------------------------------------------


def test_dial_zk_target_routes_calls_to_registered_servers(server):
    service = _service()
    Req = echo_pb2.EchoRequest
    with echo_servers("a", "b") as (sa, sb):
        pa = ZkPublisher(f"zk://{server.hosts}", service, sa.address).start()
        pb = ZkPublisher(f"zk://{server.hosts}", service, sb.address)
        try:
            with waypost.dial(f"zk://{server.hosts}/{service}", balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert stub.Unary(Req(), timeout=20).server == "a"
                pb.start()
                wait_until(lambda: {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"a", "b"}, 20,
                           what="calls reach both servers")
                pa.stop()
                wait_until(lambda: [sc.address for sc in ch.balancer.subconns()] == [sb.address], 20,
                           what="the stopped server's backend removed")
                assert {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"b"}
        finally:
            pa.stop()
            pb.stop()


async def test_async_twins_from_another_event_loop(server, plain):
    """The a* methods await the control loop's work from any event loop (here pytest-asyncio's)."""
    service = _service()
    async with ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:7060", id="aio") as pub:
        assert pub.registered and plain.exists(_path(pub)) is not None
        await pub.aupdate_metadata({"weight": 2})
        assert json.loads(plain.get(_path(pub))[0])["metadata"] == {"weight": "2"}
        await pub.apause()
        assert plain.exists(_path(pub)) is None
        await pub.aresume()
        assert plain.exists(_path(pub)) is not None
    assert plain.exists(_path(pub)) is None and pub.state == "stopped"


def test_cli_resolve_a_zk_target(server):
    import json
    import subprocess
    import sys

    service = _service()
    p = ZkPublisher(f"zk://{server.hosts}", service, "127.0.0.1:50081").start()
    try:
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "resolve", f"zk://{server.hosts}/{service}"],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["scheme"] == "zk" and [b["address"] for b in got["backends"]] == ["127.0.0.1:50081"]
    finally:
        p.stop()


def test_the_session_timeout_counted_is_the_one_the_server_granted():
    """The server bounds the session timeout asked for (maxSessionTimeout 3 s here, ``ttl=10`` asked): after a cut
    the node goes with the granted 3 s, so the publisher must count 3 s, not 10, before it calls itself
    unregistered (its outage clock, ``max_unregistered`` and ``on_unregistered`` start from there)."""
    with zk_support.ZkServer(max_session_timeout_ms=3000).start() as own:
        proxy = TcpProxy(("127.0.0.1", own.port))
        gen = _plain(own)
        plain = next(gen)
        pub = ZkPublisher(f"zk://{proxy.endpoint}", _service(), "127.0.0.1:7045", ttl=10, id="g").start()
        try:
            assert pub.client.session_timeout == pytest.approx(3.0)  # what the server granted, not the 10 s asked
            cut = time.monotonic()
            proxy.cut()
            wait_until(lambda: plain.exists(_path(pub)) is None, 10, what="the server expired the session")
            gone = time.monotonic() - cut
            wait_until(lambda: not pub.registered and pub.outage.since is not None, 10, what="publisher knows")
            knew = time.monotonic() - cut
            print(f"node gone {gone:.2f} s after the cut, publisher unregistered at {knew:.2f} s (granted 3 s)")
            assert knew < 3.0 + 2.0, f"the publisher counted the asked 10 s: unregistered only {knew:.1f} s after"
        finally:
            pub.stop()
            proxy.close()
            gen.close()


def test_the_granted_session_timeout_falls_back_to_the_one_asked():
    """kazoo says the granted timeout only in its "Session created" log line (``SessionLog`` reads it there): a
    kazoo that words it otherwise leaves ``granted`` None, and the registrar counts the timeout it asked for."""
    noted = SessionLog()
    noted.log(5, "Session created, session_id: %r session_passwd: %s\n    negotiated session timeout: %s",
              0x1234, b"00", 3000)
    assert noted.granted == 3.0
    other = SessionLog()
    other.log(5, "Session established: %r timeout %s", 0x1234, 3000)
    assert other.granted is None
    from waypost.registries.zookeeper.registrar import ZkRegistrar

    registrar = ZkRegistrar("zk://127.0.0.1:1", 1.0)
    registrar.session_timeout_asked = 10.0
    registrar._zk.log = other
    assert registrar.session_timeout == 10.0
    registrar._zk.log = noted
    assert registrar.session_timeout == 3.0
