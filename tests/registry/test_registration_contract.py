"""The Registration contract, the same for every registry: one start / pause / resume / update / stop sequence run
against the etcd ``Publisher`` (real etcd), ``ConsulPublisher`` (a real Consul agent), ``ZkPublisher`` (a real
ZooKeeper), ``EurekaPublisher`` (a real Spring Cloud Eureka server) and the example plug-in kind's (``files://``,
examples/registry_plugin), each checked by reading the registry itself; and the start-up retry: a registry that is
down when
``start()`` is called and up within its ``timeout`` gets the registration.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import waypost
from harness import consul_agent
from harness.waiting import wait_until
from tests.eureka import support as eureka_support
from tests.zookeeper import support as zk_support
from waypost import kind_table as kinds
from waypost.registration.contract import Registration
from waypost.registration.factory import make_publisher
from waypost.registration.multi import MultiPublisher
from waypost.registration.no_registry import NoRegistration

ADDR = "127.0.0.1:7301"
KINDS = ["etcd", "consul", "zk", "eureka", "files"]
#: the example plug-in kind (examples/registry_plugin): a third party's kind passes the same contract
PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "registry_plugin"


def _service() -> str:
    return f"contract-{uuid.uuid4().hex[:8]}"


class Kind:
    """One registry: its URL for ``make_publisher`` and ``view``, what it holds for a service now, read from the
    registry itself: ``{address: weight as text}``."""

    def __init__(self, url: str, view: Callable[[str], dict[str, str]], close: Callable[[], None]) -> None:
        self.url = url
        self.view = view
        self.close = close

    def make(self, service: str, **kw: Any) -> Registration:
        return make_publisher(self.url, service, ADDR, id="contract-1", ttl=5, **kw)


def _etcd_kind(node: Any) -> Kind:
    reg = waypost.connect(node.url())
    subs: dict[str, waypost.Subscriber] = {}

    def view(service: str) -> dict[str, str]:
        sub = subs.get(service)
        if sub is None:
            sub = subs[service] = waypost.Subscriber(reg, service)
        return {b.address: str(b.metadata.get("weight")) for b in sub.backends()}

    def close() -> None:
        for sub in subs.values():
            sub.close()

    return Kind(node.url(), view, close)


def _consul_kind(agent: consul_agent.ConsulAgent) -> Kind:
    def view(service: str) -> dict[str, str]:
        return {f"{e['Service']['Address']}:{e['Service']['Port']}": str(json.loads(e["Service"]["Meta"]["weight"]))
                for e in agent.health(service)}

    return Kind(agent.url, view, lambda: None)


def _zk_kind(server: zk_support.ZkServer) -> Kind:
    from kazoo.client import KazooClient

    plain = KazooClient(hosts=server.hosts, timeout=10)
    plain.start(timeout=10)

    def view(service: str) -> dict[str, str]:
        parent = f"/microservices/{service}"
        if plain.exists(parent) is None:
            return {}
        out = {}
        for child in plain.get_children(parent):
            data, _ = plain.get(f"{parent}/{child}")
            instance = json.loads(data)
            for endpoint in instance["endpoints"]:
                out[endpoint.removeprefix("grpc://")] = str((instance["metadata"] or {}).get("weight"))
        return out

    def close() -> None:
        plain.stop()
        plain.close()

    return Kind(f"zk://{server.hosts}", view, close)


def _files_kind(root: Path) -> Kind:
    sys.path.insert(0, str(PLUGIN))
    try:
        import waypost_files
    finally:
        sys.path.remove(str(PLUGIN))
    waypost.register_kind(waypost_files.KIND, replace=True)

    def view(service: str) -> dict[str, str]:
        out = {}
        for path in (root / service).glob("*.json"):
            body = json.loads(path.read_text())
            out[body["address"]] = str(body["metadata"].get("weight"))
        return out

    def close() -> None:
        with kinds._lock:  # the table as it was
            kinds.KINDS.pop("files", None)
            kinds.SCHEMES.pop("files", None)

    return Kind(f"files://{root}", view, close)
def _eureka_kind(server: eureka_support.EurekaServer) -> Kind:
    def view(service: str) -> dict[str, str]:
        return {f"{i['ipAddr']}:{i['port']['$']}": str(json.loads(i["metadata"]["weight"]))
                for i in server.instances(service) if i["status"] == "UP"}

    return Kind(server.url, view, lambda: None)


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    name = request.param
    if name == "etcd":
        k = _etcd_kind(request.getfixturevalue("shared_etcd"))
        yield k
        k.close()
    elif name == "consul":
        if why := consul_agent.skip_reason():
            pytest.skip(why)
        with consul_agent.ConsulAgent(tmp_path_factory.mktemp("consul-contract"),
                                        binary=consul_agent.consul_binary()) as agent:
            k = _consul_kind(agent)
            yield k
    elif name == "files":
        k = _files_kind(tmp_path_factory.mktemp("files-contract"))
        yield k
        k.close()
    elif name == "eureka":
        if why := eureka_support.skip_reason():
            pytest.skip(why)
        yield _eureka_kind(eureka_support.shared_server())
    else:
        if why := zk_support.skip_reason():
            pytest.skip(why)
        with zk_support.ZkServer() as server:
            k = _zk_kind(server)
            try:
                yield k
            finally:
                k.close()


pytestmark = [consul_agent.timeout_mark()]


def test_one_lifecycle_in_every_registry(kind: Kind) -> None:
    service = _service()
    pub = kind.make(service, metadata={"weight": 10})
    assert isinstance(pub, Registration)
    assert (pub.state, pub.registered, pub.key) == ("new", False, None)
    assert pub.start() is pub
    try:
        assert pub.state == "running" and pub.registered and pub.key
        key = pub.key
        wait_until(lambda: kind.view(service) == {ADDR: "10"}, 10, what="registered with its metadata")
        pub.start()  # idempotent: one registration, the same key
        assert pub.key == key and pub.unregistered_seconds == 0
        pub.pause()
        pub.pause()
        assert (pub.state, pub.registered, pub.key) == ("paused", False, None)
        wait_until(lambda: kind.view(service) == {}, 10, what="gone while paused")
        pub.update_metadata({"weight": 5})  # not registered now: the next registration carries it
        pub.start()  # paused: start is not resume
        assert pub.state == "paused" and kind.view(service) == {}
        pub.resume()
        pub.resume()
        assert pub.state == "running" and pub.registered and pub.key == key
        wait_until(lambda: kind.view(service) == {ADDR: "5"}, 10, what="registered again with the new metadata")
        pub.update_metadata({"weight": 7})
        wait_until(lambda: kind.view(service) == {ADDR: "7"}, 10, what="the metadata updated in place")
        assert pub.key == key and pub.unregistered_seconds == 0
        with pytest.raises((TypeError, ValueError)):
            pub.check_metadata({"weight": float("nan")})
    finally:
        pub.stop()
    assert (pub.state, pub.registered, pub.key) == ("stopped", False, None)
    wait_until(lambda: kind.view(service) == {}, 10, what="gone after stop")
    pub.stop()  # idempotent
    assert pub.unregistered_seconds == 0


def test_the_async_twins_drive_the_same_lifecycle(kind: Kind) -> None:
    service = _service()

    async def main() -> None:
        pub = kind.make(service, metadata={"weight": 3})
        assert await pub.astart() is pub
        try:
            assert pub.registered
            await asyncio.to_thread(wait_until, lambda: kind.view(service) == {ADDR: "3"}, 10)
            await pub.apause()
            assert not pub.registered
            await pub.aupdate_metadata({"weight": 4})
            await pub.aresume()
            await asyncio.to_thread(wait_until, lambda: kind.view(service) == {ADDR: "4"}, 10)
        finally:
            await pub.astop()
        assert pub.state == "stopped"
        await pub.astop()  # idempotent

    asyncio.run(main())
    wait_until(lambda: kind.view(service) == {}, 10, what="gone after the async stop")


def test_no_registration_and_multi_have_the_same_face(kind: Kind) -> None:
    none = make_publisher(None, "svc", ADDR)
    assert isinstance(none, NoRegistration) and isinstance(none, Registration)
    assert none.start() is none and none.state == "running" and not none.registered and none.key is None
    none.pause()
    none.update_metadata({"anything": object()})
    none.resume()
    none.stop()
    assert none.state == "stopped"

    service = _service()
    multi = make_publisher([kind.url], service, ADDR, id="contract-1", ttl=5, metadata={"weight": 2})
    assert isinstance(multi, MultiPublisher) and isinstance(multi, Registration)
    with multi:
        assert multi.registered and multi.state == "running" and multi.key
        wait_until(lambda: kind.view(service) == {ADDR: "2"}, 10, what="registered through MultiPublisher")
        multi.pause()
        assert multi.state == "paused" and not multi.registered
        multi.update_metadata({"weight": 6})
        multi.resume()
        wait_until(lambda: kind.view(service) == {ADDR: "6"}, 10, what="resumed with the new metadata")
    assert multi.state == "stopped"
    wait_until(lambda: kind.view(service) == {}, 10, what="gone after the multi stop")


# ------------------------------------------------------------------------------------- the start-up retry


def _start_in_thread(pub: Registration) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pub.start()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def test_consul_down_at_start_and_up_within_the_timeout_gets_the_registration(tmp_path: Path) -> None:
    if why := consul_agent.skip_reason():
        pytest.skip(why)
    agent = consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_agent.consul_binary())
    service = _service()
    pub = make_publisher(agent.url, service, ADDR, ttl=5, timeout=30, metadata={"weight": 1})
    try:
        t, errors = _start_in_thread(pub)
        t.join(1.5)
        assert t.is_alive() and not errors, errors  # refused so far: start() keeps trying
        agent.start()
        t.join(30)
        assert not t.is_alive() and not errors, errors
        assert pub.registered
        wait_until(lambda: agent.passing_addresses(service) == [ADDR], 10, what="registered once the agent is up")
    finally:
        pub.stop()
        agent.close()


def test_zookeeper_down_at_start_and_up_within_the_timeout_gets_the_registration() -> None:
    if why := zk_support.skip_reason():
        pytest.skip(why)
    server = zk_support.ZkServer()
    service = _service()
    pub = make_publisher(f"zk://{server.hosts}", service, ADDR, ttl=5, timeout=40, id="late")
    try:
        t, errors = _start_in_thread(pub)
        t.join(1.5)
        assert t.is_alive() and not errors, errors
        server.start()
        t.join(40)
        assert not t.is_alive() and not errors, errors
        assert pub.registered
        kind = _zk_kind(server)
        try:
            wait_until(lambda: ADDR in kind.view(service), 10, what="registered once ZooKeeper is up")
        finally:
            kind.close()
    finally:
        pub.stop()
        server.close()


def test_eureka_down_at_start_and_up_within_the_timeout_gets_the_registration() -> None:
    if why := eureka_support.skip_reason():
        pytest.skip(why)
    server = eureka_support.EurekaServer()
    service = _service()
    pub = make_publisher(server.url, service, ADDR, ttl=5, timeout=90, id="late")
    try:
        t, errors = _start_in_thread(pub)
        t.join(1.5)
        assert t.is_alive() and not errors, errors  # refused so far: start() keeps trying
        server.start()
        t.join(90)
        assert not t.is_alive() and not errors, errors
        assert pub.registered
        wait_until(lambda: server.statuses(service) == {"late": "UP"}, 10, what="registered once Eureka is up")
    finally:
        pub.stop()
        server.close()
