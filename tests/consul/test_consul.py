"""Consul: ConsulPublisher, the Consul kind's discovery and consul:// channels against a real Consul agent (v1.14.11, built once
and cached by harness/consul_agent.py; skipped, saying why, without Go). Other clients' views go through plain
HTTP (urllib), never through waypost's client."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import waypost
import waypost.resolver
from harness import consul_agent
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.consul_agent import fixture_consul_bin, fixture_shared_agent  # noqa: F401 (fixtures)
from harness.consul_agent import unique_name as _name
from harness.latency_proxy import LatencyProxy
from harness.tcp_proxy import TcpProxy
from harness.waiting import wait_until
from tests.resolver.updates import ResolverUpdates
from waypost.errors import InvalidTarget, RegistryUnavailable
from waypost.etcd.local import free_port
from waypost.kinds.resolver import KindResolver
from waypost.registries.consul import ConsulConfig, from_target, parse_registry_url
from waypost.registries.consul.api import decode_meta, encode_meta
from waypost.registries.consul.kind import KIND
from waypost.registries.consul.registrar import ConsulPublisher
from waypost.resolver import ResolverOptions, parse_target
from waypost.types import Backend

pytestmark = [consul_agent.timeout_mark()]






@pytest.fixture
def agent(consul_bin, tmp_path) -> Iterator[consul_agent.ConsulAgent]:
    """An agent of its own, for tests that stop or restart it."""
    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_bin) as a:
        yield a


class Updates(ResolverUpdates):
    sort = True


def _resolver(target: str, *, blocking: bool = True, settle: float | None = None, **kw: Any
              ) -> tuple[KindResolver, Updates]:
    r = KindResolver(KIND, parse_target(target), ResolverOptions(blocking=blocking), **kw)
    if settle is not None:
        r.discovery.empty.settle = settle  # type: ignore[attr-defined]
    u = Updates()
    r.start(u.on_update, u.on_error)
    return r, u


# ---------------------------------------------------------------------------------------------- no agent


def test_registry_url_and_target_config(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    c = parse_registry_url(f"consul://10.0.0.5?token=s3cret&ca={ca}&dc=eu")
    assert (c.address, c.token, c.tls, c.ca_file, c.datacenter) == ("10.0.0.5:8500", "s3cret", True, str(ca), "eu")
    assert "s3cret" not in c.redacted and "s3cret" not in repr(c) and "token=***" in c.redacted
    assert parse_registry_url(c.url) == c
    assert parse_registry_url("consul://[::1]:8501?tls=1").base_url == "https://[::1]:8501"
    for bad, part in [("consul://h:99999", "bad port"), ("consul://h?tokn=x", "unknown option 'tokn'"),
                      ("consul://h?ca=/nonexistent", "does not exist"), ("consul://h/greet", "unexpected path"),
                      ("consul://a:1,b:2", "one Consul agent"), ("etcd://h:2379", "expected scheme consul"),
                      ("consul://h?token=x&token=y", "given twice"), ("consul://h?tls=maybe", "not a boolean")]:
        with pytest.raises(InvalidTarget, match=part):
            parse_registry_url(bad)
    with pytest.raises(InvalidTarget) as e:
        parse_registry_url("consul://h?token=hidden&bogus=1")
    assert "hidden" not in str(e.value)
    t = from_target(parse_target(f"consul://127.0.0.1:8600/greet?tag=a,b&dc=dc2&token=tk&cacert={ca}"))
    assert t == ConsulConfig("127.0.0.1:8600", token="tk", tls=True, ca_file=str(ca), datacenter="dc2")


def test_meta_encoding_round_trips():
    md = {"weight": 20, "zone": "eu-1", "ratio": 0.5, "on": True, "none": None, "obj": {"a": [1, "x"]},
          "looks_like_number": "20", "quoted": '"q"', "nan_text": "NaN", "tags": ["blue", "v2"]}
    tags, meta = encode_meta(md)
    assert tags == ["blue", "v2"]
    assert meta["weight"] == "20" and meta["zone"] == "eu-1" and meta["on"] == "true"
    assert meta["looks_like_number"] == '"20"' and meta["nan_text"] == "NaN"
    assert all(isinstance(v, str) for v in meta.values())
    assert decode_meta(meta, tags) == md
    # what a non-waypost client writes: strings; numbers and booleans come back as values
    assert decode_meta({"weight": "5", "version": "v1.2", "canary": "false"}, []) == {
        "weight": 5, "version": "v1.2", "canary": False}
    for bad in ({"bad key": 1}, {"consul-x": 1}, {"k": "x" * 600}, {"tags": "a"}, {f"k{i}": i for i in range(65)}):
        with pytest.raises((TypeError, ValueError)):
            encode_meta(bad)


def test_publisher_validates_its_arguments():
    with pytest.raises(ValueError, match="wildcard"):
        ConsulPublisher("consul://127.0.0.1:1", "greet", "0.0.0.0:80")
    with pytest.raises(ValueError, match="Meta key"):
        ConsulPublisher("consul://127.0.0.1:1", "greet", "127.0.0.1:80", metadata={"a b": 1})
    with pytest.raises(ValueError, match="cannot contain '/'"):
        ConsulPublisher("consul://127.0.0.1:1", "a/b", "127.0.0.1:80")
    with pytest.raises(InvalidTarget):
        ConsulPublisher("consul://127.0.0.1:1?x=1", "greet", "127.0.0.1:80")


def test_unreachable_agent_fails_fast():
    port = free_port()  # nothing listens: refused at once
    t0 = time.monotonic()
    # start() retries a refused agent (it may be starting too) until its timeout, as every publisher does
    with pytest.raises(RegistryUnavailable, match="could not register 'greet'"):
        ConsulPublisher(f"consul://127.0.0.1:{port}", "greet", "127.0.0.1:5000", timeout=2).start()
    assert time.monotonic() - t0 < 3.0
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="no list of the instances of service 'greet'.*unreachable"):
        _resolver(f"consul://127.0.0.1:{port}/greet", timeout=1.0)
    assert time.monotonic() - t0 < 2.0
    # an agent that accepts connections and never answers: bounded by timeout
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="within 1s"):
            ConsulPublisher(f"consul://127.0.0.1:{hole.getsockname()[1]}", "greet", "127.0.0.1:5000",
                            timeout=1).start()
        assert time.monotonic() - t0 < 2.5


# --------------------------------------------------------------------------------------------- real agent


def test_publisher_registers_for_every_client_and_stop_deregisters(shared_agent):
    a = shared_agent
    name = _name("greet")
    md = {"weight": 20, "zone": "eu-1", "tags": ["v1", "blue"]}
    p = ConsulPublisher(a.url, name, "127.0.0.1:50051", ttl=1, metadata=md).start()
    try:
        sid = f"{name}-127.0.0.1-50051"
        assert p.key == sid and p.registered and p.lease_id is None and p.registrations == 1
        (entry,) = a.health(name)
        svc = entry["Service"]
        assert (svc["ID"], svc["Service"], svc["Address"], svc["Port"]) == (sid, name, "127.0.0.1", 50051)
        assert svc["Meta"] == {"weight": "20", "zone": "eu-1"} and svc["Tags"] == ["v1", "blue"]
        (check,) = [c for c in entry["Checks"] if c["CheckID"] == f"service:{sid}"]
        assert check["Status"] == "passing" and check["Type"] == "ttl"
        assert [s["ServiceID"] for s in a.catalog(name)] == [sid]
        agent_check = a.get("/v1/agent/checks")[f"service:{sid}"]
        assert agent_check["Type"] == "ttl"
        # the TTL (1 s) is kept passing well beyond itself
        time.sleep(2.5)
        assert a.passing_addresses(name) == ["127.0.0.1:50051"]
        assert p.renewals >= 4 and p.registrations == 1
    finally:
        p.stop()
    assert not p.registered and p.key is None
    assert a.health(name, passing=False) == [] and a.catalog(name) == []
    p.stop()  # idempotent


def test_resolver_follows_registrations_of_another_client(shared_agent):
    a = shared_agent
    name = _name("echo")
    a.register(name, "127.0.0.1", 7001, meta={"weight": "5", "zone": "a"}, tags=["blue"])
    r, u = _resolver(f"consul://{a.address}/{name}")
    try:
        assert u.last == [Backend("127.0.0.1:7001", {"weight": 5, "zone": "a", "tags": ["blue"]})]
        t0 = time.monotonic()
        a.register(name, "127.0.0.2", 7002)
        wait_until(lambda: u.addresses() == ["127.0.0.1:7001", "127.0.0.2:7002"], 10)
        assert time.monotonic() - t0 < 2  # a blocking query answers at once, not after its wait
        a.deregister(f"{name}-127.0.0.1-7001")
        wait_until(lambda: u.addresses() == ["127.0.0.2:7002"], 10)
        # an instance without its own Address has its node's
        a.put("/v1/agent/service/register", {"ID": f"{name}-noaddr", "Name": name, "Port": 7003})
        wait_until(lambda: u.addresses() == ["127.0.0.1:7003", "127.0.0.2:7002"], 10)
        assert u.errors == [] and r.discovery.index > 1
    finally:
        r.close()


def test_instances_failing_their_check_disappear(shared_agent):
    a = shared_agent
    name = _name("chk")
    ok = a.register(name, "127.0.0.1", 7101, ttl="60s")
    bad = a.register(name, "127.0.0.1", 7102, ttl="60s")
    r, u = _resolver(f"consul://{a.address}/{name}")
    try:
        assert u.addresses() == ["127.0.0.1:7101", "127.0.0.1:7102"]
        a.check(f"service:{bad}", "fail")
        wait_until(lambda: u.addresses() == ["127.0.0.1:7101"], 10)
        a.check(f"service:{bad}", "pass")
        wait_until(lambda: u.addresses() == ["127.0.0.1:7101", "127.0.0.1:7102"], 10)
        a.check(f"service:{ok}", "fail")
        a.check(f"service:{bad}", "fail")
        wait_until(lambda: u.addresses() == [], 10)
    finally:
        r.close()


def test_tag_filters(shared_agent):
    a = shared_agent
    name = _name("tags")
    a.register(name, "127.0.0.1", 7201, tags=["a", "b"])
    a.register(name, "127.0.0.1", 7202, tags=["a"])
    a.register(name, "127.0.0.1", 7203)
    resolvers = []
    try:
        for query, want in [("", [7201, 7202, 7203]), ("?tag=a", [7201, 7202]), ("?tag=a,b", [7201]),
                            ("?tag=zzz", [])]:
            r, u = _resolver(f"consul://{a.address}/{name}{query}")
            resolvers.append(r)
            assert u.addresses() == [f"127.0.0.1:{p}" for p in want], query
        a.register(name, "127.0.0.1", 7204, tags=["b", "a", "c"])
        wait_until(lambda: u.addresses() == [], 3)  # the ?tag=zzz resolver: unchanged
        r, u = _resolver(f"consul://{a.address}/{name}?tag=a,b")
        resolvers.append(r)
        assert u.addresses() == ["127.0.0.1:7201", "127.0.0.1:7204"]
    finally:
        for r in resolvers:
            r.close()


def test_datacenter_filter(shared_agent, consul_bin, tmp_path):
    """A second agent in datacenter dc2, WAN-joined: ?dc=dc2 reads its services through the first agent."""
    a = shared_agent
    name = _name("dc")
    with consul_agent.ConsulAgent(tmp_path / "dc2", datacenter="dc2", node="waypost-dc2", binary=consul_bin) as b:
        a.put(f"/v1/agent/join/127.0.0.1:{b.serf_wan_port}?wan=1")
        wait_until(lambda: "dc2" in a.get("/v1/catalog/datacenters"), 15)
        b.register(name, "127.0.0.1", 7301)
        a.register(name, "127.0.0.1", 7302)
        r1, u1 = _resolver(f"consul://{a.address}/{name}")
        r2, u2 = _resolver(f"consul://{a.address}/{name}?dc=dc2")
        try:
            assert u1.addresses() == ["127.0.0.1:7302"]
            assert u2.addresses() == ["127.0.0.1:7301"]
            b.register(name, "127.0.0.1", 7303)
            wait_until(lambda: u2.addresses() == ["127.0.0.1:7301", "127.0.0.1:7303"], 10)
            assert u1.addresses() == ["127.0.0.1:7302"]
        finally:
            r1.close()
            r2.close()
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="(?i)no path to datacenter"):
            _resolver(f"consul://{a.address}/{name}?dc=nowhere", timeout=5)
        assert time.monotonic() - t0 < 3  # a refusal is reported at once, not after the timeout
        a.put("/v1/agent/force-leave/waypost-dc2.dc2?wan=1")


def test_update_metadata_is_one_change_and_pause_resume(shared_agent):
    a = shared_agent
    name = _name("md")
    p = ConsulPublisher(a.url, name, "127.0.0.1:7401", metadata={"weight": 10}).start()
    r, u = _resolver(f"consul://{a.address}/{name}")
    try:
        assert u.last == [Backend("127.0.0.1:7401", {"weight": 10})]
        before = len(u.lists)
        p.update_metadata({"weight": 3, "zone": "b"})
        wait_until(lambda: u.last == [Backend("127.0.0.1:7401", {"weight": 3, "zone": "b"})], 10)
        time.sleep(0.5)  # nothing else follows
        assert len(u.lists) == before + 1, u.lists[before:]
        assert a.health(name)[0]["Service"]["ID"] == p.key == f"{name}-127.0.0.1-7401"
        assert p.registrations == 1
        p.pause()
        assert not p.registered and p.key is None
        wait_until(lambda: u.addresses() == [], 10)
        assert a.catalog(name) == []
        p.resume()
        wait_until(lambda: u.last == [Backend("127.0.0.1:7401", {"weight": 3, "zone": "b"})], 10)
        assert p.registered and p.outage.since is None
    finally:
        r.close()
        p.stop()


def test_registration_removed_from_outside_comes_back(shared_agent):
    a = shared_agent
    name = _name("guard")
    p = ConsulPublisher(a.url, name, "127.0.0.1:7501", ttl=30, id="inst-1").start()  # passes only every 10 s
    try:
        assert p.key == "inst-1"
        t0 = time.monotonic()
        a.deregister("inst-1")
        wait_until(lambda: a.passing_addresses(name) == ["127.0.0.1:7501"] and p.registrations == 2, 10)
        assert time.monotonic() - t0 < 3  # the guard's blocking read saw it, not the next pass
        # overwritten by someone else with other content: ours is put back
        a.register(name, "127.0.0.9", 9999, id="inst-1")
        wait_until(lambda: a.passing_addresses(name) == ["127.0.0.1:7501"], 10)
        assert p.client.restored >= 1 and p.outage.since is None
    finally:
        p.stop()


def test_agent_restart_registers_again_and_resolver_follows(agent):
    name = _name("rst")
    p = ConsulPublisher(agent.url, name, "127.0.0.1:7601", ttl=5).start()
    r, u = _resolver(f"consul://{agent.address}/{name}")
    try:
        assert u.addresses() == ["127.0.0.1:7601"]
        t_down = time.monotonic()
        agent.restart()  # -dev: every registration is gone with the old process
        t_up = time.monotonic()
        wait_until(lambda: agent.passing_addresses(name) == ["127.0.0.1:7601"], 15)
        reregistered = time.monotonic() - t_up
        assert reregistered < 4, reregistered
        wait_until(lambda: p.registrations == 2 and p.registered and p.outage.since is None, 5)
        wait_until(lambda: u.addresses() == ["127.0.0.1:7601"], 15)
        assert r.discovery.failures >= 1
        # the resolver follows the new agent at once (no query held with the old agent's index)
        t0 = time.monotonic()
        agent.register(name, "127.0.0.1", 7602)
        wait_until(lambda: u.addresses() == ["127.0.0.1:7601", "127.0.0.1:7602"], 10)
        assert time.monotonic() - t0 < 2
        print(f"agent restart: down+up {t_up - t_down:.2f}s (start {agent.startup_seconds:.2f}s), registered again "
              f"{reregistered:.2f}s after the agent was ready")
    finally:
        r.close()
        p.stop()


def test_consul_down_keeps_the_last_list_and_resumes(shared_agent):
    a = shared_agent
    name = _name("down")
    a.register(name, "127.0.0.1", 7701)
    proxy = TcpProxy(("127.0.0.1", a.http_port))
    r, u = _resolver(f"consul://{proxy.endpoint}/{name}", timeout=1.0)
    try:
        assert u.addresses() == ["127.0.0.1:7701"]
        n = len(u.lists)
        proxy.cut()
        wait_until(lambda: u.errors, 10)
        a.register(name, "127.0.0.1", 7702)  # while the resolver cannot see it
        time.sleep(1.0)
        assert len(u.lists) == n and u.addresses() == ["127.0.0.1:7701"]
        index = r.discovery.index
        proxy.restore()
        wait_until(lambda: u.addresses() == ["127.0.0.1:7701", "127.0.0.1:7702"], 15)
        assert r.discovery.resets == 0 and r.discovery.index > index  # resumed from its index
    finally:
        r.close()
        proxy.close()


def test_pass_failures_within_the_ttl_cause_no_churn(shared_agent):
    a = shared_agent
    name = _name("slow")
    proxy = TcpProxy(("127.0.0.1", a.http_port))
    alerts: list[Any] = []
    p = ConsulPublisher(f"consul://{proxy.endpoint}", name, "127.0.0.1:7801", ttl=3, timeout=1,
                        max_unregistered=0.5, on_unregistered=alerts.append).start()
    try:
        proxy.cut()  # shorter than the TTL: passes fail, the check stays passing
        for _ in range(15):
            time.sleep(0.1)
            assert a.passing_addresses(name) == ["127.0.0.1:7801"]
        proxy.restore()
        wait_until(lambda: p.renewals >= 2, 10)
        assert p.registrations == 1 and p.outage.since is None and p.registered
        proxy.cut()  # longer than the TTL: lost, registered again once the agent is reachable
        wait_until(lambda: p.outage.since is not None and not p.registered, 10)
        wait_until(lambda: a.passing_addresses(name) == [], 10)
        wait_until(lambda: alerts == [p], 5)  # max_unregistered: on_unregistered(publisher)
        proxy.restore()
        wait_until(lambda: a.passing_addresses(name) == ["127.0.0.1:7801"] and p.registered, 10)
        assert p.registrations == 2 and p.outage.since is None and p.outage.alerts == 1
    finally:
        p.stop()
        proxy.close()


def test_slow_link_keeps_one_registration(shared_agent):
    a = shared_agent
    name = _name("lat")
    proxy = LatencyProxy(("127.0.0.1", a.http_port), delay=0.4)  # each request takes > 0.8 s
    p = ConsulPublisher(f"consul://{proxy.endpoint}", name, "127.0.0.1:7901", ttl=2, timeout=3).start()
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert a.passing_addresses(name) == ["127.0.0.1:7901"]
            time.sleep(0.2)
        assert p.registrations == 1 and p.outage.since is None and p.renewals >= 2
    finally:
        p.stop()
        proxy.close()


def test_dial_consul_target_routes_calls_to_real_backends(shared_agent):
    a = shared_agent
    name = _name("greet")
    servers = [EchoServer(f"b{i}").start() for i in range(2)]
    pubs = [ConsulPublisher(a.url, name, s.address, metadata={"weight": 1}).start() for s in servers]
    try:
        with waypost.dial(f"consul://{a.address}/{name}", balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            seen = {stub.Unary(echo_pb2.EchoRequest(message="hi"), timeout=10).server for _ in range(20)}
            assert seen == {"b0", "b1"}
            pubs[0].stop()  # deregistered: the channel drops it
            wait_until(lambda: {stub.Unary(echo_pb2.EchoRequest(), timeout=10).server for _ in range(6)} == {"b1"},
                       15)
    finally:
        for p in pubs:
            p.stop()
        for s in servers:
            s.stop(0)


def test_health_entries_are_plain_json(shared_agent):
    """What the resolver reads is what any client reads: a sanity check of the wire shape it relies on."""
    a = shared_agent
    name = _name("wire")
    a.register(name, "127.0.0.1", 8001, meta={"k": json.dumps({"x": 1})})
    (entry,) = a.health(name)
    assert set(entry) >= {"Node", "Service", "Checks"} and entry["Node"]["Address"] == "127.0.0.1"
    r, u = _resolver(f"consul://{a.address}/{name}")
    try:
        assert u.last == [Backend("127.0.0.1:8001", {"k": {"x": 1}})]
    finally:
        r.close()


def test_acl_token_from_url_target_and_environment(consul_bin, tmp_path, monkeypatch, caplog):
    with consul_agent.ConsulAgent(tmp_path / "acl", binary=consul_bin, acl_token="root-secret") as a:
        name = _name("acl")
        writer = a.make_token(f'service "{name}" {{ policy = "write" }} node_prefix "" {{ policy = "read" }}',
                              name="writer")
        reader = a.make_token(f'service "{name}" {{ policy = "read" }} node_prefix "" {{ policy = "read" }}',
                              name="reader")
        monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
        t0 = time.monotonic()
        with pytest.raises(waypost.errors.PermissionDenied, match="service:write") as e:
            ConsulPublisher(a.url, name, "127.0.0.1:8101").start()
        assert "no token was sent" in str(e.value) and time.monotonic() - t0 < 3
        with pytest.raises(waypost.errors.PermissionDenied):
            ConsulPublisher(f"{a.url}?token={reader}", name, "127.0.0.1:8101").start()
        p = ConsulPublisher(f"{a.url}?token={writer}", name, "127.0.0.1:8101").start()
        try:
            assert writer not in repr(p)
            r, u = _resolver(f"consul://{a.address}/{name}?token={reader}")
            r.close()
            assert u.addresses() == ["127.0.0.1:8101"]
            r, u = _resolver(f"consul://{a.address}/{name}")  # anonymous: the ACLs hide the instance
            r.close()
            assert u.addresses() == [] and r.discovery.acl_hidden
            assert any("has no instance this token can see" in m for m in caplog.messages)
            monkeypatch.setenv("CONSUL_HTTP_TOKEN", reader)
            r, u = _resolver(f"consul://{a.address}/{name}")
            r.close()
            assert u.addresses() == ["127.0.0.1:8101"]
            time.sleep(0.5)
            assert p.renewals >= 0 and p.registrations == 1 and p.registered
        finally:
            p.stop()
        assert a.health(name, passing=False) == []


def test_https_with_client_certificates(consul_bin, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost", "server.dc1.consul")
    client = ca.issue_cert("waypost-client")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "srv.pem", tmp_path / "srv.key"
    ca.cert_pem.write_to_path(str(ca_file))
    server.cert_chain_pems[0].write_to_path(str(cert_file))
    server.private_key_pem.write_to_path(str(key_file))
    client_cert, client_key = tmp_path / "client.pem", tmp_path / "client.key"
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    with consul_agent.ConsulAgent(tmp_path / "tls", binary=consul_bin,
                                    tls_files=(str(ca_file), str(cert_file), str(key_file))) as a:
        name = _name("tls")
        https = f"127.0.0.1:{a.https_port}"
        p = ConsulPublisher(f"consul://{https}?ca={ca_file}&cert={client_cert}&key={client_key}", name,
                            "127.0.0.1:8201").start()
        try:
            assert p.config.base_url == f"https://{https}"
            assert a.passing_addresses(name) == ["127.0.0.1:8201"]
            r, u = _resolver(f"consul://{https}/{name}?tls=1&cacert={ca_file}&certfile={client_cert}"
                             f"&keyfile={client_key}")
            r.close()
            assert u.addresses() == ["127.0.0.1:8201"]
            with pytest.raises(RegistryUnavailable):  # no client certificate: the agent refuses the handshake
                _resolver(f"consul://{https}/{name}?cacert={ca_file}", timeout=2)
            with pytest.raises(RegistryUnavailable, match="(?i)certificate"):  # a CA that did not sign the agent's
                _resolver(f"consul://{https}/{name}?tls=1", timeout=2)
        finally:
            p.stop()
        assert a.health(name) == []


async def test_async_twins(shared_agent):
    a = shared_agent
    name = _name("aio")
    p = ConsulPublisher(a.url, name, "127.0.0.1:8301", metadata={"weight": 1})
    async with p:
        assert p.registered and a.passing_addresses(name) == ["127.0.0.1:8301"]
        await p.aupdate_metadata({"weight": 2})
        assert a.health(name)[0]["Service"]["Meta"] == {"weight": "2"}
        await p.apause()
        assert a.catalog(name) == []
        await p.aresume()
        assert a.passing_addresses(name) == ["127.0.0.1:8301"]
    assert not p.registered and a.catalog(name) == []


def test_consul_dns_answers_for_a_waypost_registration(consul_bin, tmp_path):
    """Consul DNS, the other way Consul users read the catalog: SRV and A records of a waypost registration,
    and no answer once it stopped (the check's critical state hides it from DNS too)."""
    import dns.message
    import dns.query
    import dns.rcode
    import dns.rdatatype

    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_bin, dns=True) as agent:
        name = _name("dns")
        server = ("127.0.0.1", agent.dns_port)

        def ask(rdtype: str) -> Any:
            q = dns.message.make_query(f"{name}.service.consul", rdtype)
            return dns.query.udp(q, server[0], port=server[1], timeout=2)

        p = ConsulPublisher(agent.url, name, "127.0.0.1:50061", ttl=5).start()
        try:
            srv = [r for rrset in ask("SRV").answer for r in rrset if r.rdtype == dns.rdatatype.SRV]
            assert [r.port for r in srv] == [50061], srv
            a = [r.address for rrset in ask("A").answer for r in rrset if r.rdtype == dns.rdatatype.A]
            assert a == ["127.0.0.1"], a
        finally:
            p.stop()
        wait_until(lambda: ask("SRV").rcode() == dns.rcode.NXDOMAIN or not ask("SRV").answer, 10,
                   what="gone from Consul DNS once deregistered")


def test_cli_resolve_and_watch_a_consul_target(shared_agent):
    import subprocess
    import sys

    name = _name("cli")
    p = ConsulPublisher(shared_agent.url, name, "127.0.0.1:50071", ttl=5, metadata={"weight": 3}).start()
    try:
        target = f"consul://{shared_agent.address}/{name}"
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "resolve", target],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["scheme"] == "consul" and got["format"] is None
        assert [(b["address"], b["metadata"].get("weight")) for b in got["backends"]] == [("127.0.0.1:50071", 3)]
        watch = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "watch", target, "--for", "0.5"],
                               check=False, capture_output=True, text=True, timeout=60)
        assert watch.returncode == 0, watch.stderr
        (event,) = [json.loads(line) for line in watch.stdout.splitlines()]
        assert (event["event"], event["address"]) == ("present", "127.0.0.1:50071")
    finally:
        p.stop()
