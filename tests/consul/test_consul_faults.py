"""Consul resolver under faults, against a real Consul agent (v1.14.11, harness/consul_agent.py): answers that are
not Consul's (a proxy or another server at the agent's address: ``consul_agent.HealthProxy``), an address that
accepts connections and never answers, and an agent restarted with its state (a server agent with a data dir)
whose instances come back critical until their owners pass their checks again."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import waypost
from harness import consul_agent
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.consul_agent import fixture_consul_bin, fixture_shared_agent  # noqa: F401 (fixtures)
from harness.consul_agent import unique_name as _name
from harness.tcp_proxy import TcpProxy
from harness.waiting import wait_until
from tests.resolver.updates import ResolverUpdates
from waypost.errors import RegistryUnavailable
from waypost.kinds.resolver import KindResolver
from waypost.registries.consul.kind import KIND
from waypost.registries.consul.registrar import ConsulPublisher
from waypost.resolver import ResolverOptions, parse_target

pytestmark = [consul_agent.timeout_mark()]


#: what a proxy or another server at the agent's address might answer with a 200
NOT_INSTANCES = b'[1,"x",null]'
SERVICE_IS_A_STRING = b'[{"Node": {"Address": "127.0.0.1"}, "Service": "greet", "Checks": []}]'
NOT_A_LIST = b'{"error": "upstream timed out"}'
NOT_JSON = b"<html><body>502 Bad Gateway</body></html>"





@pytest.fixture
def persistent_agent(consul_bin, tmp_path) -> Iterator[consul_agent.ConsulAgent]:
    """A server agent keeping its data dir across restarts (not -dev)."""
    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_bin, persistent=True) as a:
        yield a


@pytest.fixture
def health_proxy(shared_agent) -> Iterator[consul_agent.HealthProxy]:
    proxy = consul_agent.HealthProxy(("127.0.0.1", shared_agent.http_port), [NOT_INSTANCES])
    try:
        yield proxy
    finally:
        proxy.close()


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


def _metric(registry: Any, reason: str) -> float:
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "waypost_resolver_errors_total" and sample.labels.get("reason") == reason:
                total += sample.value
    return total


# ------------------------------------------------------------------------------------------ malformed answers


def test_malformed_answers_fail_a_blocking_dial_naming_the_reason(shared_agent, health_proxy):
    """A blocking dial against an address answering 200 with something else than Consul's list: it keeps
    asking (with backoff, counted) and, when it gives up, names what it got."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    waypost.metrics.enable(registry)
    try:
        name = _name("bad")
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match=r"malformed answer from consul at http://127\.0\.0\.1:\d+: "
                                                      r"no entry of the 3 is an instance \(an entry is a int"):
            waypost.dial(f"consul://{health_proxy.address}/{name}")
        assert time.monotonic() - t0 < 8
        assert health_proxy.health_requests >= 3  # retried with backoff, not given up after the first answer
        assert _metric(registry, "malformed") >= 3
        for body, why in [(SERVICE_IS_A_STRING, "an entry's 'Service' is a str, not an object"),
                          (NOT_A_LIST, "the instances of .* are a dict, not a list"),
                          (NOT_JSON, "not JSON")]:
            health_proxy.bodies = [body]
            with pytest.raises(RegistryUnavailable, match=f"malformed answer from consul at .*{why}"):
                _resolver(f"consul://{health_proxy.address}/{name}", timeout=1.5)
    finally:
        waypost.metrics.disable()


def test_a_non_blocking_channel_recovers_once_the_answers_are_good(shared_agent, health_proxy):
    """Malformed answers first (entries of the wrong types), then the proxy forwards to the real agent: the
    channel keeps asking meanwhile and its calls succeed once the answers are good."""
    name = _name("recover")
    server = EchoServer("r").start()
    pub = ConsulPublisher(shared_agent.url, name, server.address, ttl=5).start()
    health_proxy.bodies = [NOT_INSTANCES, SERVICE_IS_A_STRING, NOT_A_LIST]
    try:
        with waypost.dial(f"consul://{health_proxy.address}/{name}", block=False) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            with pytest.raises(grpc.RpcError):
                stub.Unary(echo_pb2.EchoRequest(message="early"), timeout=1)
            # the resolver is alive and asks again (with backoff): before, one bad answer ended its loop
            wait_until(lambda: health_proxy.health_requests >= 3, 20, what="the resolver asking again")
            health_proxy.mode = "forward"
            wait_until(lambda: _call_ok(stub), 30, what="a call succeeding once the answers are Consul's")
            for _ in range(5):
                assert stub.Unary(echo_pb2.EchoRequest(message="hi"), timeout=5).server == "r"
    finally:
        pub.stop()
        server.stop(0)


def _call_ok(stub: Any) -> bool:
    try:
        stub.Unary(echo_pb2.EchoRequest(message="probe"), timeout=2)
    except grpc.RpcError:
        return False
    return True


def test_malformed_entries_are_skipped_and_the_good_ones_used(shared_agent, health_proxy, caplog):
    """Entries of the wrong shape beside well-formed ones: the good ones make the list, each distinct problem
    is logged once (not once per answer)."""
    a = shared_agent
    name = _name("mixed")
    a.register(name, "127.0.0.1", 7011)
    health_proxy.mode = "mix"  # every query answers at once (no blocking): many answers in a short time
    health_proxy.extra = [1, {"Service": "x"}, {"Node": {}, "Service": {"Address": "127.0.0.1", "Port": "80"}},
                          "text"]
    caplog.set_level(logging.WARNING, logger="waypost.resolver.consul")
    r, u = _resolver(f"consul://{health_proxy.address}/{name}")
    try:
        assert u.addresses() == ["127.0.0.1:7011"]
        wait_until(lambda: r.discovery.queries >= 10, 20, what="ten answers read")
        a.register(name, "127.0.0.1", 7012)
        wait_until(lambda: u.addresses() == ["127.0.0.1:7011", "127.0.0.1:7012"], 10)
        skipped = [m for m in caplog.messages if "skipping malformed entries" in m]
        assert sorted(m.split(": ")[-1] for m in skipped) == sorted([
            "an entry is a int, not an object", "an entry is a str, not an object",
            "an entry's 'Service' is a str, not an object", "an entry's 'Service.Port' is a str, not a number"]), skipped
        assert r.discovery.malformed >= 4 * 10 and u.errors == []
    finally:
        r.close()


def test_any_json_is_read_without_raising_anything_but_malformed_answer():
    """Whatever JSON list the health endpoint's address answers, reading it gives backends or MalformedAnswer,
    never another exception (which would have ended the resolver's loop)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    from waypost.registries.consul.api import MalformedAnswer
    from waypost.registries.consul.discovery import ConsulDiscovery

    leaf = st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False) | st.text(max_size=8)
    json_values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                               | st.dictionaries(st.sampled_from(["Service", "Node", "Address", "Port", "ID", "Meta",
                                                                  "Tags", "x"]), inner, max_size=4), max_leaves=12)
    entry = st.fixed_dictionaries({"Service": json_values, "Node": json_values}) | json_values
    resolver = ConsulDiscovery(parse_target("consul://127.0.0.1:1/svc"))

    @hypothesis.settings(max_examples=300, deadline=None, database=None)
    @hypothesis.given(st.lists(entry, max_size=5))
    def check(entries: list[Any]) -> None:
        try:
            backends = resolver.backends(entries)
        except MalformedAnswer:
            return
        assert all(b.address.rsplit(":", 1)[1].isdigit() for b in backends)

    check()


# ------------------------------------------------------------------------------------------ no answer at all


def test_an_agent_that_accepts_and_never_answers_is_named():
    """An address that takes the connection (the kernel completes the handshake) and never answers: the dial
    fails within its timeout saying so, not only that no list came."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        port = hole.getsockname()[1]
        with pytest.raises(RegistryUnavailable) as e:
            waypost.dial(f"consul://127.0.0.1:{port}/greet")
    # the dial's bound, not what was left of it for the last retry (it said "within 0.348507s")
    assert (f"consul agent at http://127.0.0.1:{port} accepted the connection but did not answer within 5s "
            "(reading the instances of 'greet')") in str(e.value), str(e.value)


def test_serve_against_an_agent_that_accepts_and_never_answers_says_it_as_the_dial_does(unique_key):
    """The same black hole when a server registers: the same words as the dial (which agent, accepted the
    connection, did not answer, within the bound), not "timed out"."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        port = hole.getsockname()[1]
        try:
            with pytest.raises(RegistryUnavailable) as e:
                waypost.serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"consul://127.0.0.1:{port}")
        finally:
            server.stop(None)
    text = str(e.value)
    assert f"consul agent at http://127.0.0.1:{port} accepted the connection but did not answer within 5s (" in text, \
        text
    assert "timed out" not in text, text


# -------------------------------------------------------------------------------------------- agent restart


class _Load:
    """One caller in a loop (bounded: ``limit_s``) through ``stub`` until stopped; counts calls and failures."""

    def __init__(self, stub: Any, limit_s: float = 120.0) -> None:
        self.stub = stub
        self.sent = 0
        self.failed: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + limit_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            self.sent += 1
            try:
                self.stub.Unary(echo_pb2.EchoRequest(delay_ms=2), timeout=5)
            except grpc.RpcError as e:
                self.failed.append((time.monotonic(), f"{e.code().name}: {e.details()}"[:160]))
                self._stop.wait(0.01)  # a channel failing fast must not spin

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def test_agent_restart_with_its_state_keeps_the_list_under_load(persistent_agent):
    """A server agent (data dir kept) down 10 s, longer than the instance's TTL (5 s): it comes back with the
    instance in its catalog but critical until the publisher passes its check again. A resolver reading in
    that window must not empty the channel.

    How the window is made certain (it lasts ~1-2 s on its own, and whether the resolver's backoff lands in it is
    luck): the publisher reaches the agent through a TCP proxy that stays cut after the agent's return, until
    the resolver has read the restarted agent's empty answer; then the publisher's link is restored and it
    passes its check (registers again) within about a second."""
    agent = persistent_agent
    name = _name("restart")
    server = EchoServer("a").start()
    link = TcpProxy(("127.0.0.1", agent.http_port))  # the publisher's link to the agent
    pub = ConsulPublisher(f"consul://{link.endpoint}", name, server.address, ttl=5).start()
    load = None
    try:
        with waypost.dial(f"consul://{agent.address}/{name}") as ch:
            resolver = ch._resolver
            stub = echo_pb2_grpc.EchoStub(ch)
            assert stub.Unary(echo_pb2.EchoRequest(), timeout=10).server == "a"
            load = _Load(stub)
            wait_until(lambda: load.sent > 20, 20, what="calls under way")
            agent.stop()  # SIGTERM
            failures_before = resolver.discovery.failures
            time.sleep(10.0)
            link.cut()
            queries = resolver.discovery.queries  # no answer while the agent is down
            agent.start()  # same data dir: the instance is back, critical (its TTL ran out meanwhile)
            t_up = time.monotonic()
            # the resolver has read the restarted agent and seen no passing instance (held, or pushed)
            wait_until(lambda: resolver.discovery.failures > failures_before and resolver.discovery.queries > queries
                       and (resolver.discovery.empty.holds >= 1 or resolver._last == ()), 40,
                       what="the resolver reading the restarted agent's empty answer")
            seen_empty_after = time.monotonic() - t_up
            time.sleep(1.0)  # calls go on meanwhile
            link.restore()
            wait_until(lambda: agent.passing_addresses(name) == [server.address], 20,
                       what="the publisher passing again")
            wait_until(lambda: resolver._last is not None and len(resolver._last) == 1, 20)
            time.sleep(1.0)
            load.stop()
            print(f"agent restart: {load.sent} calls, {len(load.failed)} failed; the resolver saw the empty "
                  f"answer {seen_empty_after:.2f}s after the agent was back; holds={resolver.discovery.empty.holds}")
            assert load.failed == [], f"{len(load.failed)} of {load.sent} calls failed: {load.failed[:3]}"
            assert resolver.discovery.empty.holds == 1
    finally:
        if load is not None:
            load.stop()
        pub.stop()
        link.close()
        server.stop(0)


def test_an_empty_list_after_a_reconnect_is_applied_once_confirmed(persistent_agent):
    """A service really gone while the agent was down (its check expired, nobody passes it): after the hold
    the empty list is applied. Outside a reconnect an empty answer is applied as it comes."""
    agent = persistent_agent
    name = _name("gone")
    sid = agent.register(name, "127.0.0.1", 7021, ttl="2s")
    r, u = _resolver(f"consul://{agent.address}/{name}", settle=2.0)
    try:
        assert u.addresses() == ["127.0.0.1:7021"]
        agent.check(f"service:{sid}", "pass")
        agent.stop()
        time.sleep(3.0)  # longer than the TTL: the check comes back critical
        agent.start()
        wait_until(lambda: r.discovery.empty.holds == 1, 40, what="the empty answer after the reconnect held")
        assert u.addresses() == ["127.0.0.1:7021"]
        wait_until(lambda: u.addresses() == [], 20, what="the empty list applied once confirmed")
        # no reconnect since: an empty answer is applied at once
        agent.register(name, "127.0.0.1", 7022)
        wait_until(lambda: u.addresses() == ["127.0.0.1:7022"], 10)
        agent.deregister(f"{name}-127.0.0.1-7022")
        wait_until(lambda: u.addresses() == [], 5)
        assert r.discovery.empty.holds == 1
    finally:
        r.close()


def test_health_proxy_forwards_everything_else(shared_agent, health_proxy):
    """The proxy is only a wrong server for the health endpoint: other requests reach the agent."""
    status, raw = shared_agent.request("GET", "/v1/status/leader")
    assert status == 200
    req = f"http://{health_proxy.address}/v1/status/leader"
    import urllib.request

    with urllib.request.urlopen(req, timeout=5) as resp:
        assert json.loads(resp.read()) == json.loads(raw)
