"""A Consul registry on the console: every catalog service listed through waypost's Consul resolver, read-only
(a real Consul dev agent; skips, saying why, without one)."""

from __future__ import annotations

from tests.console_support import echo_serve, http, running_console, write
from tests.consul_support import fixture_consul_bin, fixture_shared_agent, unique_name  # noqa: F401 (fixtures)
from tests.waiting import wait_until
from waypost.console.consul_source import service_target
from waypost.consul import ConsulConfig


def test_consul_services_are_listed_read_only_and_follow_the_catalog(shared_agent):
    name = unique_name("console")
    a = echo_serve("a", name, shared_agent.url, metadata={"weight": 20, "zone": "z9"})
    stopped = False
    try:
        with running_console(registries=[shared_agent.url]) as (_, url):
            def row() -> dict | None:
                for s in http(f"{url}api/services")[1]["services"]:
                    if s["key"] == name and s["instances"]:
                        return s
                return None

            svc = wait_until(row, 15, what="the consul service listed")
            assert svc["format"] == "consul" and not svc["writable"]
            inst = svc["instances"][0]
            assert inst["address"] == a.address and inst["metadata"]["zone"] == "z9" and inst["weight"] == 20
            status, answer = write(url, "drain", {"key": name, "address": a.address})
            assert status == 404 and "etcd or memory" in answer["error"]
            a.stop()
            stopped = True
            wait_until(lambda: row() is None, 90, what="the service gone once deregistered")
    finally:
        if not stopped:
            a.stop()


def test_service_target_carries_the_agent_settings():
    config = ConsulConfig(address="127.0.0.1:8500", token="s3cret", datacenter="dc2")
    assert service_target(config, "a b") == "consul://127.0.0.1:8500/a%20b?token=s3cret&dc=dc2"
