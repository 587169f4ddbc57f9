"""A Consul registry on the console: every catalog service listed through waypost's Consul resolver, and drain /
weight / undrain through override keys in Consul's KV store that ``ConsulPublisher`` follows (a real Consul dev
agent; skips, saying why, without one)."""

from __future__ import annotations

import json

from click.testing import CliRunner

import waypost
from harness.consul_agent import fixture_consul_bin, fixture_shared_agent, unique_name  # noqa: F401 (fixtures)
from harness.waiting import wait_until
from tests.console.support import echo_serve, http, running_console, write
from waypost.cli.commands import app
from waypost.registries.consul import ConsulConfig


def test_consul_services_are_listed_drained_through_the_kv_store_and_follow_the_catalog(shared_agent):
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
            assert svc["format"] == "consul" and svc["writable"]
            inst = svc["instances"][0]
            assert inst["address"] == a.address and inst["metadata"]["zone"] == "z9" and inst["weight"] == 20
            status, answer = write(url, "drain", {"key": name, "address": a.address})
            assert status == 200, answer
            drained = wait_until(lambda: (r := row()) and r["instances"][0]["weight"] == 0 and r["instances"][0], 15,
                                 what="the registration drained by its ConsulPublisher")
            assert drained["metadata"]["zone"] == "z9"
            wait_until(lambda: (row() or {"instances": [{}]})["instances"][0].get("override"), 15,
                       what="the override shown")
            assert write(url, "weight", {"key": name, "address": a.address, "weight": 7})[0] == 200
            wait_until(lambda: (r := row()) and r["instances"][0]["weight"] == 7, 15, what="weight 7")
            assert write(url, "undrain", {"key": name, "address": a.address})[0] == 200
            wait_until(lambda: (r := row()) and r["instances"][0]["weight"] == 20
                       and r["instances"][0]["override"] is None, 15, what="its own weight back")
            a.stop()
            stopped = True
            wait_until(lambda: row() is None, 90, what="the service gone once deregistered")
    finally:
        if not stopped:
            a.stop()


def test_service_target_carries_the_agent_settings():
    config = ConsulConfig(address="127.0.0.1:8500", token="s3cret", datacenter="dc2")
    assert config.target("a b") == "consul://127.0.0.1:8500/a%20b?token=s3cret&dc=dc2"


def test_cli_drain_in_consul_reaches_the_publisher(shared_agent):
    name = unique_name("cli")
    a = echo_serve("a", name, shared_agent.url)
    try:
        with waypost.dial(f"consul://{shared_agent.address}/{name}") as ch:
            def weight() -> object:
                return {sc.address: sc.backend.metadata.get("weight") for sc in ch.balancer.subconns()}.get(a.address)

            wait_until(lambda: a.address in {sc.address for sc in ch.balancer.subconns()}, 15)
            run = CliRunner()
            res = run.invoke(app, ["--registry", shared_agent.url, "--json", "drain", name, a.address],
                             catch_exceptions=False)
            assert res.exit_code == 0, res.output
            assert json.loads(res.output.splitlines()[0])["registered"] is True
            wait_until(lambda: weight() == 0, 15, what="the client sees weight 0")
            res = run.invoke(app, ["--registry", shared_agent.url, "undrain", name, a.address], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            wait_until(lambda: weight() is None, 15, what="no weight once undrained")
    finally:
        a.stop()


def test_a_console_on_a_dead_agent_shows_it_down_and_recovers_when_it_answers(consul_bin, tmp_path):
    from harness.consul_agent import ConsulAgent

    agent = ConsulAgent(tmp_path / "consul", binary=consul_bin)  # its ports picked, nothing listening yet
    name = unique_name("down")
    try:
        with running_console(registries=[agent.url], timeout=2.0) as (console, url):
            source = console.source_names()[0]

            def state() -> dict:
                return http(f"{url}api/services")[1]["sources"][source]

            down = wait_until(lambda: (s := state())["error"] and s, 15, what="the agent shown as down")
            assert agent.address in down["error"] and down["kind"] == "consul" and not down["read"], down
            agent.start()
            a = echo_serve("a", name, agent.url)
            try:
                wait_until(lambda: any(s["key"] == name and s["instances"]
                                       for s in http(f"{url}api/services")[1]["services"]), 30,
                           what="the service listed once the agent answers")
                assert state()["error"] is None and state()["read"] is True
            finally:
                a.stop()
    finally:
        agent.close()
