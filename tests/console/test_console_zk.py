"""Drain for ZooKeeper registrations: ``waypost --registry zk://... drain`` writes the override znode that
a registration in ZooKeeper follows (a real ZooKeeper; skips, saying why, without Java or its jars)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import waypost
from harness.waiting import wait_until
from tests.console.support import echo_serve, http, instances, running_console, write
from tests.zookeeper import support as zk_support
from waypost.cli.commands import app


@pytest.fixture(scope="module")
def server() -> Iterator[zk_support.ZkServer]:
    reason = zk_support.skip_reason()
    if reason:
        pytest.skip(reason)
    s = zk_support.ZkServer().start()
    try:
        yield s
    finally:
        s.close()


def test_cli_drain_weight_undrain_reach_the_zk_publisher(server):
    name = f"console-{uuid.uuid4().hex[:8]}"
    url = f"zk://{server.hosts}"
    a = echo_serve("a", name, url, metadata={"weight": 20, "zone": "z1"})
    run = CliRunner()
    try:
        with waypost.dial(f"zk://{server.hosts}/{name}") as ch:
            def meta() -> dict:
                return {sc.address: dict(sc.backend.metadata) for sc in ch.balancer.subconns()}.get(a.address) or {}

            wait_until(lambda: meta().get("zone") == "z1", 15, what="the registration seen")
            res = run.invoke(app, ["--registry", url, "--json", "drain", name, a.address], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            done = json.loads(res.output.splitlines()[0])
            assert done["registered"] is True and done["record"] == f"_waypost/override/{name}/{a.address}"
            wait_until(lambda: meta() == {"weight": "0", "zone": "z1"}, 15, what="weight 0 seen by the client")
            res = run.invoke(app, ["--registry", url, "weight", name, a.address, "5"], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            wait_until(lambda: meta().get("weight") == "5", 15, what="weight 5")
            res = run.invoke(app, ["--registry", url, "undrain", name, a.address], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            wait_until(lambda: meta() == {"weight": "20", "zone": "z1"}, 15, what="its own weight back")
    finally:
        a.stop()


def test_a_zk_publisher_started_under_an_override_registers_drained(server):
    name = f"console-{uuid.uuid4().hex[:8]}"
    url = f"zk://{server.hosts}"
    addr = "127.0.0.1:7499"
    run = CliRunner()
    res = run.invoke(app, ["--registry", url, "--json", "drain", name, addr], catch_exceptions=False)
    assert res.exit_code == 0 and json.loads(res.output.splitlines()[0])["registered"] is False, res.output
    try:
        with waypost.ZkPublisher(url, name, addr) as pub:
            from kazoo.client import KazooClient

            plain = KazooClient(hosts=server.hosts, timeout=10)
            plain.start(timeout=10)
            try:  # the node as first written: drained already
                data, stat = plain.get(f"/microservices/{name}/{pub.instance_id}")
                assert json.loads(data)["metadata"] == {"weight": "0"} and stat.version == 0
            finally:
                plain.stop()
                plain.close()
            assert pub.override is not None and pub.override["weight"] == 0
    finally:
        run.invoke(app, ["--registry", url, "undrain", name, addr], catch_exceptions=False)


def test_the_console_lists_zk_services_and_drains_them(server):
    name = f"console-{uuid.uuid4().hex[:8]}"
    url = f"zk://{server.hosts}"
    a = echo_serve("a", name, url, metadata={"weight": 20})
    try:
        with running_console(registries=[url]) as (_, curl):
            def inst() -> dict:
                got = instances(curl, name)
                return got.get(a.address) or {}

            wait_until(lambda: inst().get("weight") == 20, 15, what="the zk service listed")
            svc = next(s for s in http(f"{curl}api/services")[1]["services"] if s["key"] == name)
            assert svc["format"] == "zk" and svc["writable"] and svc["source"] == url
            assert write(curl, "drain", {"key": name, "address": a.address})[0] == 200
            wait_until(lambda: inst().get("weight") == 0 and inst().get("override"), 15, what="drained, override shown")
            assert write(curl, "undrain", {"key": name, "address": a.address})[0] == 200
            wait_until(lambda: inst().get("weight") == 20 and inst().get("override") is None, 15,
                       what="its own weight back")
            a.stop()
            wait_until(lambda: not inst(), 15, what="the instance gone")
    finally:
        a.stop()


def test_a_console_on_a_dead_zookeeper_shows_it_down_and_recovers_when_it_answers(server):
    late = zk_support.ZkServer()  # its port picked, nothing listening yet
    name = f"console-{uuid.uuid4().hex[:8]}"
    url = f"zk://{late.hosts}"
    try:
        with running_console(registries=[url], timeout=2.0) as (console, curl):
            source = console.source_names()[0]

            def state() -> dict:
                return http(f"{curl}api/services")[1]["sources"][source]

            down = wait_until(lambda: (s := state())["error"] and s, 15, what="ZooKeeper shown as down")
            assert late.hosts in down["error"] and down["kind"] == "zk" and not down["read"], down
            late.start()
            a = echo_serve("a", name, url)
            try:
                wait_until(lambda: a.address in instances(curl, name), 30, what="the service listed once it answers")
                assert state()["error"] is None and state()["read"] is True
            finally:
                a.stop()
    finally:
        late.close()
