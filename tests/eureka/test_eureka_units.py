"""Eureka without a server: URLs and targets, the metadata codec, instances, the registry copy, its delta and the
reconcile hash code (the JSON is what a Spring Cloud Eureka server answers: shared/notes' observed REST behaviour)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from waypost.discovery.registry_url import parse_any
from waypost.errors import InvalidTarget, RegistryUnavailable
from waypost.kind_table import KINDS, kind_of
from waypost.registries.eureka.api import EurekaClient
from waypost.registries.eureka.apps import (
    Instance,
    RegistryCopy,
    decode_metadata,
    encode_metadata,
    reconcile_hashcode,
)
from waypost.registries.eureka.config import EurekaConfig, parse_registry_url, target_for
from waypost.registries.eureka.discovery import EurekaDiscovery
from waypost.registries.http_kind import ProblemsSaid
from waypost.resolver import parse_target


def test_registry_urls() -> None:
    c = parse_registry_url("eureka://10.0.0.1,10.0.0.2:8762")
    assert c == EurekaConfig(servers=("10.0.0.1:8761", "10.0.0.2:8762"))
    assert c.base_url(c.servers[0]) == "http://10.0.0.1:8761/eureka"
    assert parse_registry_url("EUREKA://h:1?path=/registry/&tls=1").base_url("h:1") == "https://h:1/registry"
    assert parse_registry_url(c.url) == c and isinstance(parse_any("eureka://h"), EurekaConfig)
    for bad, says in [("eureka://", "no host"), ("eureka://h:99999", "port"), ("eureka://h?ttl=3", "unknown option"),
                      ("eureka://h/greeter", "the app is the key"), ("eureka://u:p@h", "user info"),
                      ("eureka://h?path=eureka", "must start with '/'"), ("consul://h", "expected scheme")]:
        with pytest.raises(InvalidTarget, match=says):
            parse_registry_url(bad)
    assert kind_of("eureka://h").registrar is not None and KINDS["eureka"].default_port == 8761


def test_dial_targets() -> None:
    t = parse_target("eureka://127.0.0.1,127.0.0.2:9000/greeter?interval=2s&path=/e")
    s = EurekaDiscovery(t)
    assert (s.app, s.interval, s.config.servers, s.config.path) == (
        "GREETER", 2.0, ("127.0.0.1:8761", "127.0.0.2:9000"), "/e")
    assert parse_target(target_for(s.config, "GREETER", 2.0)).options["interval"] == "2s"
    assert EurekaDiscovery(parse_target("eureka://h/x")).interval <= 5  # a few seconds by default
    for bad, says in [("eureka://h/g?interval=2", "interval='2'"), ("eureka://h/g?interval=0s", "> 0s"),
                      ("eureka://h/", "missing the service name"), ("eureka://h/g?key=x", "unknown"),
                      ("eureka://h/g?path=x", "path='x'")]:
        with pytest.raises(InvalidTarget, match=says):
            parse_target(bad)


def test_metadata_round_trips_as_strings() -> None:
    md = {"weight": 20, "zone": "eu-1", "canary": True, "text20": "20", "empty": "", "nested": {"a": [1]}}
    wire = encode_metadata(md)
    assert all(isinstance(v, str) for v in wire.values())
    assert wire["weight"] == "20" and wire["zone"] == "eu-1" and wire["text20"] == '"20"'
    assert decode_metadata(wire) == md
    # what Spring writes; codec markers and empty values (a key taken back) are left out
    assert decode_metadata({"management.port": "8080", "@class": "java.util.Collections$EmptyMap", "w": ""}) == {
        "management.port": 8080}
    with pytest.raises(ValueError, match="cannot be an Eureka metadata key"):
        encode_metadata({"bad key": 1})


def _inst(iid: str, status: str = "UP", port: int = 5000, meta: dict[str, str] | None = None,
          action: str = "ADDED") -> dict[str, object]:
    return {"instanceId": iid, "app": "GREETER", "ipAddr": "127.0.0.1", "status": status,
            "port": {"$": port, "@enabled": "true"}, "metadata": meta or {}, "actionType": action}


def test_instances_take_the_grpc_port_from_metadata() -> None:
    assert Instance.from_json(_inst("a", meta={"gRPC_port": "6565"})).address == "127.0.0.1:6565"
    assert Instance.from_json(_inst("a", meta={"gRPC_port": "x"})).address == "127.0.0.1:5000"
    disabled = {**_inst("a"), "port": {"$": 5000, "@enabled": "false"}}
    assert Instance.from_json(disabled).address is None
    with pytest.raises(ValueError, match="no ipAddr"):
        Instance.from_json({"instanceId": "a", "app": "X", "status": "UP"})


def test_the_delta_and_the_reconcile_hash_code() -> None:
    assert reconcile_hashcode(["UP", "OUT_OF_SERVICE", "UP"]) == "OUT_OF_SERVICE_1_UP_2_"  # Eureka's own format
    copy, problems = RegistryCopy(), []
    # a single instance written as the object itself (some codecs do), and a malformed one beside it
    copy.replace({"application": [{"name": "GREETER", "instance": _inst("a")},
                                  {"name": "OTHER", "instance": [{"instanceId": "z"}]}]}, problems)
    assert [i.id for i in copy.instances("GREETER")] == ["a"] and len(problems) == 1
    delta = {"application": [{"name": "GREETER", "instance": [
        _inst("b", action="ADDED"), _inst("a", "OUT_OF_SERVICE", action="MODIFIED")]}]}
    copy.apply_delta(delta, problems)
    copy.apply_delta(delta, problems)  # idempotent: a delta fetched twice changes nothing more
    assert copy.hashcode() == "OUT_OF_SERVICE_1_UP_1_"
    copy.apply_delta({"application": {"name": "GREETER", "instance": _inst("a", action="DELETED")}}, problems)
    assert [i.id for i in copy.instances("GREETER")] == ["b"] and copy.hashcode() == "UP_1_"
    copy.apply_delta({"application": {"name": "GREETER", "instance": _inst("b", action="DELETED")}}, problems)
    assert copy.names() == [] and copy.hashcode() == ""


def test_a_server_that_accepts_and_never_answers_is_named_with_how_far_the_request_got() -> None:
    """A loopback socket that completes the handshake and never answers: the failure says the server accepted the
    connection but did not answer (not only that it timed out), as Consul's client says it (registries.http_kind)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        port = hole.getsockname()[1]
        client = EurekaClient(EurekaConfig(servers=(f"127.0.0.1:{port}",)), timeout=0.5)

        async def fetch() -> None:
            try:
                await client.apps()
            finally:
                await client.close()

        with pytest.raises(RegistryUnavailable) as e:
            asyncio.run(fetch())
    assert f"http://127.0.0.1:{port}/eureka accepted the connection but did not answer within 0.5s" in str(e.value)


def test_each_malformed_problem_is_said_once() -> None:
    said = ProblemsSaid()
    assert said.new(["a", "b", "a"]) == ["a", "b"] and said.new(["b", "c"]) == ["c"] and said.new(["a"]) == []
    said.new(f"p{i}" for i in range(ProblemsSaid.LIMIT))  # the memory is bounded: it starts over
    assert said.new(["a"]) == ["a"]
