"""Eureka: EurekaPublisher, the Eureka discovery (through waypost's resolver) and eureka:// channels against a real Spring Cloud Netflix Eureka server,
and a stock Spring Cloud Eureka client for the other direction (both built once and cached by
tests/eureka/support.py; skipped, saying why, without java or mvn). One server for the module (a JVM start is the
slow part); each test uses its own app names. Other clients' views go through plain HTTP (urllib)."""

from __future__ import annotations

import http.server
import json
import logging
import socketserver
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer, EchoServicer
from harness.waiting import wait_until
from tests.eureka import support as eureka_support
from tests.eureka.support import EurekaServer, SpringClient, unique_app
from tests.resolver.updates import ResolverUpdates
from waypost.errors import RegistryUnavailable
from waypost.etcd.local import free_port
from waypost.kinds.resolver import KindResolver
from waypost.registries.eureka.discovery import EurekaDiscovery
from waypost.registries.eureka.kind import KIND
from waypost.registries.eureka.registrar import EurekaPublisher, EurekaRegistrar
from waypost.resolver import ResolverOptions, parse_target

pytestmark = [eureka_support.timeout_mark()]


@pytest.fixture(scope="module")
def eureka() -> EurekaServer:
    if why := eureka_support.skip_reason():
        pytest.skip(why)
    return eureka_support.shared_server()


class Updates(ResolverUpdates):
    sort = True


def _resolver(target: str, settle: float | None = None, **kw: Any) -> tuple[KindResolver, Updates]:
    """The resolver ``dial(target)`` makes (the kind's discovery under waypost's resolver), started."""
    r = KindResolver(KIND, parse_target(target), ResolverOptions(blocking=kw.pop("blocking", True)), **kw)
    if settle is not None:
        _eureka(r).hold.settle = settle
    u = Updates()
    r.start(u.on_update, u.on_error)
    return r, u


def _eureka(r: KindResolver) -> EurekaDiscovery:
    assert isinstance(r.discovery, EurekaDiscovery)
    return r.discovery


def _echo(name: str) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
    return server


# ------------------------------------------------------------------------------------------------- no server


def test_unreachable_eureka_at_serve_and_at_dial() -> None:
    port = free_port()  # nothing listens
    url = f"eureka://127.0.0.1:{port}"
    with pytest.raises(RegistryUnavailable, match=rf"could not register .* in eureka://127.0.0.1:{port} within 1.5s"
                                                  rf".*: cannot reach Eureka at http://127.0.0.1:{port}/eureka"):
        waypost.serve(_echo("x"), "greeter", listen_on="127.0.0.1:0", registry=url, register_timeout=1.5)
    # a blocking dial raises one sentence naming Eureka's URL once, and why; an aio-style (non-blocking) channel's
    # calls fail UNAVAILABLE with the same words instead of hanging
    with pytest.raises(RegistryUnavailable) as e:
        _resolver(f"{url}/greeter", timeout=1.0)
    assert str(e.value) == (f"eureka: no list of the instances of app GREETER within 1s (cannot reach Eureka at "
                            f"http://127.0.0.1:{port}/eureka: connection refused; is it running?)")
    with waypost.dial(f"{url}/greeter", block=False) as ch, pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "eureka" in err.value.details() and f"127.0.0.1:{port}" in err.value.details()


# -------------------------------------------------------------------------------------------- real server


def test_serve_registers_what_spring_expects_and_stop_deletes_first(eureka: EurekaServer) -> None:
    key = unique_app("greeter")
    handle = waypost.serve(_echo("a"), key, listen_on="127.0.0.1:0", registry=eureka.url, ttl=6,
                           metadata={"weight": 20, "zone": "eu-1"}, grace=1.0)
    try:
        (inst,) = wait_until(lambda: eureka.instances(key), 15, what="the instance in Eureka")
        host, port = handle.address.rsplit(":", 1)
        assert inst["app"] == key.upper() and inst["vipAddress"] == key
        assert inst["instanceId"] == f"{host}:{key}:{port}" and inst["ipAddr"] == host
        assert inst["port"]["$"] == int(port) and inst["status"] == "UP"
        assert inst["dataCenterInfo"]["name"] == "MyOwn" and inst["leaseInfo"]["durationInSecs"] == 6
        assert inst["metadata"] == {"weight": "20", "zone": "eu-1", "gRPC_port": port}
    finally:
        handle.stop()
    # deleted before draining: the server holds nothing once stop() returns
    assert eureka.statuses(key) == {} or wait_until(lambda: eureka.statuses(key) == {}, 3)


def test_dial_follows_up_instances_and_a_status_override_drains_without_a_failed_call(eureka: EurekaServer) -> None:
    key = unique_app("drain")
    servers = [EchoServer(f"b{i}").start() for i in range(2)]
    pubs = [EurekaPublisher(eureka.url, key, s.address, ttl=6, metadata={"weight": 1}).start() for s in servers]
    # another client's instances that are not UP are left out
    assert eureka.register(key, "starting-1", free_port(), status="STARTING") == 204
    assert eureka.register(key, "down-1", free_port(), status="DOWN") == 204
    try:
        wait_until(lambda: len(eureka.listed(key)) == 4, 30, what="the instances readable by clients")
        with waypost.dial(f"eureka://{eureka.address}/{key}?interval=0.5s", balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: {stub.Unary(echo_pb2.EchoRequest(), timeout=10).server for _ in range(8)}
                       == {"b0", "b1"}, 30, what="both backends serve")
            stop = threading.Event()
            failed: list[str] = []
            seen: list[tuple[float, str]] = []

            def load() -> None:
                while not stop.is_set():
                    try:
                        seen.append((time.monotonic(), stub.Unary(echo_pb2.EchoRequest(), timeout=10).server))
                    except grpc.RpcError as e:
                        failed.append(f"{e.code()}: {e.details()}")
                    time.sleep(0.01)

            t = threading.Thread(target=load, daemon=True)
            t.start()
            try:
                at = time.monotonic()
                assert eureka.set_status(key, pubs[0].instance_id, "OUT_OF_SERVICE") == 200
                wait_until(lambda: seen and seen[-1][0] > at and all(s == "b1" for _, s in seen[-20:]), 30,
                           what="no more calls to the drained instance")
                last_b0 = max(ts for ts, s in seen if s == "b0")
                print(f"\nFIGURE eureka drain by status override: {last_b0 - at:.2f} s from the override to the "
                      f"last call to it (fetch interval 0.5 s, server read cache 1 s)")
                assert eureka.clear_status(key, pubs[0].instance_id) == 200
                wait_until(lambda: any(s == "b0" for _, s in seen[-20:]), 30, what="back after the override went")
            finally:
                stop.set()
                t.join(15)
            assert failed == []
    finally:
        for p in pubs:
            p.stop()
        for s in servers:
            s.stop(0)


def test_an_instance_deleted_from_outside_registers_again_at_the_next_heartbeat(eureka: EurekaServer) -> None:
    key = unique_app("gone")
    pub = EurekaPublisher(eureka.url, key, "127.0.0.1:50071", ttl=3).start()
    try:
        wait_until(lambda: eureka.statuses(key), 15)
        assert eureka.delete(key, pub.instance_id) == 200
        wait_until(lambda: pub.registrations == 2 and pub.registered, 15, what="registered again after a 404")
        wait_until(lambda: eureka.statuses(key) == {pub.instance_id: "UP"}, 15)
    finally:
        pub.stop()


def test_the_first_server_unreachable_fails_over_to_the_next(eureka: EurekaServer) -> None:
    key = unique_app("failover")
    dead = f"127.0.0.1:{free_port()}"
    pub = EurekaPublisher(f"eureka://{dead},{eureka.address}", key, "127.0.0.1:50072", ttl=3).start()
    r, u = _resolver(f"eureka://{dead},{eureka.address}/{key}?interval=0.5s")
    d = _eureka(r)
    try:
        assert isinstance(pub.client, EurekaRegistrar)
        assert pub.client.client.server == eureka.address and pub.client.client.failovers == 1
        wait_until(lambda: u.addresses() == ["127.0.0.1:50072"], 15)
        assert d.copy.filled and u.errors == []
    finally:
        r.close()
        pub.stop()


def test_delta_fetches_follow_changes_and_a_mismatch_fetches_everything(eureka: EurekaServer) -> None:
    key = unique_app("delta")
    pubs = [EurekaPublisher(eureka.url, key, f"127.0.0.1:{50080 + i}", ttl=6, metadata={"weight": i + 1}).start()
            for i in range(2)]
    r, u = _resolver(f"eureka://{eureka.address}/{key}?interval=0.3s")
    d = _eureka(r)
    try:
        wait_until(lambda: u.addresses() == ["127.0.0.1:50080", "127.0.0.1:50081"], 15)
        wait_until(lambda: d.delta_fetches >= 2, 15)
        full = d.full_fetches
        pubs[1].update_metadata({"weight": 9})
        wait_until(lambda: u.last and {b.address: b.metadata["weight"] for b in u.last}.get("127.0.0.1:50081") == 9,
                   15, what="the new weight through a delta")
        pubs[0].stop()
        wait_until(lambda: u.addresses() == ["127.0.0.1:50081"], 15, what="the deleted instance gone via the delta")
        assert d.delta_fetches > 2 and d.full_fetches - full <= d.mismatches
        # a copy that differs from the server's (here: made to) is caught by the hash code and fetched again
        d.copy.apps.setdefault("GHOST", {})
        from waypost.registries.eureka.apps import Instance

        d.copy.apps["GHOST"]["x"] = Instance("GHOST", "x", "127.0.0.1", 1, "UP")
        mismatches = d.mismatches
        wait_until(lambda: d.mismatches > mismatches and "GHOST" not in d.copy.apps, 15)
    finally:
        r.close()
        for p in pubs:
            p.stop()


class _Proxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def _proxy(upstream: str) -> tuple[_Proxy, dict[str, bytes | None]]:
    """An HTTP server in front of Eureka: forwards, or answers ``mode["body"]`` (200) while it is set."""
    mode: dict[str, bytes | None] = {"body": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else None
            body, status = mode["body"], 200
            if body is None:
                req = urllib.request.Request(f"http://{upstream}{self.path}", data=data, method=self.command,
                                             headers={"Accept": "application/json",
                                                      "Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as resp:
                        body, status = resp.read(), resp.status
                except urllib.error.HTTPError as e:
                    body, status = e.read(), e.code
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = _any

    server = _Proxy(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, mode


def test_a_bad_or_partial_answer_keeps_the_last_list_and_is_logged_once(eureka: EurekaServer, caplog) -> None:
    key = unique_app("bad")
    pub = EurekaPublisher(eureka.url, key, "127.0.0.1:50090", ttl=6).start()
    proxy, mode = _proxy(eureka.address)
    r, u = _resolver(f"eureka://127.0.0.1:{proxy.server_address[1]}/{key}?interval=0.2s")
    d = _eureka(r)
    try:
        wait_until(lambda: u.addresses() == ["127.0.0.1:50090"], 15)
        pushes = r.pushes
        caplog.set_level(logging.WARNING, logger="waypost.resolver.eureka")
        for body in (b'{"applications": {"application": [{"name": "X", "inst', b"<html>proxy error</html>",
                     b'{"something": "else"}'):
            mode["body"] = body
            wait_until(lambda before=d.failures: d.failures >= before + 2, 30, what="the bad answer read again")
        assert u.addresses() == ["127.0.0.1:50090"] and r.pushes == pushes  # the last list kept
        warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        assert len(warnings) == 3, warnings  # one per distinct problem, not one per fetch
        assert "not JSON" in warnings[0] and "no 'applications'" in warnings[2]
        mode["body"] = None
        wait_until(lambda: r.pushes > pushes, 30,
                   what="working again (the list pushed again to say so)")
    finally:
        r.close()
        pub.stop()
        proxy.shutdown()


def test_spring_client_and_waypost_see_each_other(eureka: EurekaServer) -> None:
    ours, theirs = unique_app("py"), unique_app("spring")
    grpc_port = free_port()
    pub = EurekaPublisher(eureka.url, ours, "127.0.0.1:50095", ttl=6, metadata={"weight": 7}).start()
    try:
        with SpringClient(eureka, theirs, grpc_port, watch=(ours,)) as spring:
            (seen,) = wait_until(lambda: spring.instances(ours), 60, what="Spring's DiscoveryClient sees ours")
            assert (seen["host"], seen["port"]) == ("127.0.0.1", 50095)
            assert seen["metadata"]["gRPC_port"] == "50095" and seen["metadata"]["weight"] == "7"
            r, u = _resolver(f"eureka://{eureka.address}/{theirs}?interval=0.5s")
            try:
                wait_until(lambda: u.addresses() == [f"127.0.0.1:{grpc_port}"], 60,
                           what="waypost sees Spring's instance at its gRPC_port")
                assert u.last is not None and u.last[0].metadata["management.port"] == 8080
            finally:
                r.close()
    finally:
        pub.stop()


def test_cli_on_an_unreachable_eureka_is_one_sentence() -> None:
    """``waypost resolve`` and ``waypost drain`` with no Eureka there: one line, the URL once, why, and what to check
    (aiohttp's own text named the host three times)."""
    from click.testing import CliRunner

    from waypost.cli.commands import app

    port = free_port()  # nothing listens
    base = f"http://127.0.0.1:{port}/eureka"
    for argv, line in [
        (["resolve", f"eureka://127.0.0.1:{port}/greeter", "--timeout", "1"],
         (f"Error: eureka: no list of the instances of app GREETER within 1s (cannot reach Eureka at {base}: "
          "connection refused; is it running?)")),
        (["--registry", f"eureka://127.0.0.1:{port}", "drain", "greeter", "127.0.0.1:5000"],
         f"Error: cannot reach Eureka at {base}: connection refused; is it running?"),
    ]:
        res = CliRunner().invoke(app, argv, catch_exceptions=False)
        assert res.exit_code == 1 and res.stderr.splitlines() == [line], res.output


def test_cli_resolve_and_xds_export_a_eureka_target(eureka: EurekaServer) -> None:
    import subprocess
    import sys

    from waypost.xds.exports import parse_export
    from waypost.xds.sources import start_source

    key = unique_app("cli")
    pub = EurekaPublisher(eureka.url, key, "127.0.0.1:50097", ttl=6, metadata={"weight": 3}).start()
    try:
        target = f"eureka://{eureka.address}/{key}"
        wait_until(lambda: eureka.listed(key), 30, what="the instance readable by clients")
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "resolve", target],
                             check=False, capture_output=True, text=True, timeout=90,
                             env=_child_env())
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["scheme"] == "eureka"
        assert [(b["address"], b["metadata"].get("weight")) for b in got["backends"]] == [("127.0.0.1:50097", 3)]
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "resolve", target], check=False,
                             capture_output=True, text=True, timeout=90, env=_child_env())
        assert out.returncode == 0, out.stderr
        title = out.stdout.splitlines()[0]  # the service named plainly: no wire format (that is etcd's)
        assert title.startswith(f"{target}  (eureka, service {key!r}): 1 address(es)"), title
        seen: list[list[str]] = []
        resolver = start_source(parse_export(f"greeter={target}"), lambda name, b: seen.append([x.address for x in b]),
                                lambda name, msg: None)
        try:
            wait_until(lambda: seen and seen[-1] == ["127.0.0.1:50097"], 15, what="the xDS export's endpoints")
        finally:
            resolver.close()
    finally:
        pub.stop()


def _child_env() -> dict[str, str]:
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root)]))


@pytest.fixture
def own_eureka() -> Iterator[EurekaServer]:
    if why := eureka_support.skip_reason():
        pytest.skip(why)
    with EurekaServer() as server:
        yield server


def test_console_lists_eureka_apps_and_drains_through_the_status_override(eureka: EurekaServer) -> None:
    from tests.console.support import echo_serve, http, running_console, write

    name = unique_app("console")
    a = echo_serve("a", name, eureka.url, ttl=6, metadata={"weight": 20, "zone": "z9"})
    try:
        wait_until(lambda: eureka.listed(name), 30, what="readable")  # a loaded machine: serve()'s start-up retry
        with running_console(registries=[eureka.url]) as (_, url):
            def row() -> dict[str, Any] | None:
                for s in http(f"{url}api/services")[1]["services"]:
                    if s["key"] == name.upper() and s["instances"]:
                        return s
                return None

            svc = wait_until(row, 30, what="the eureka app listed")
            assert svc["format"] == "eureka" and svc["writable"]
            inst = svc["instances"][0]
            assert inst["address"] == a.address and inst["metadata"]["zone"] == "z9" and inst["weight"] == 20
            status, answer = write(url, "drain", {"key": svc["key"], "address": a.address})
            assert status == 200, answer
            wait_until(lambda: eureka.statuses(name) == {a.publisher.key: "OUT_OF_SERVICE"}, 15)
            wait_until(lambda: row() is None, 30, what="out of every client's list")
            assert write(url, "weight", {"key": svc["key"], "address": a.address, "weight": 7})[0] == 200
            wait_until(lambda: (r := row()) and r["instances"][0]["weight"] == 7, 30, what="UP again with weight 7")
            assert write(url, "undrain", {"key": svc["key"], "address": a.address})[0] == 200
            wait_until(lambda: (r := row()) and r["instances"][0]["weight"] == 20
                       and "waypost.weight.own" not in r["instances"][0]["metadata"], 30, what="its own weight back")
    finally:
        a.stop()


EMPTY_REGISTRY = b'{"applications": {"versions__delta": "1", "apps__hashcode": "", "application": []}}'


def test_an_empty_registry_after_an_outage_is_held_then_applied_if_it_stays(eureka: EurekaServer) -> None:
    """What a client sees of an Eureka restarted empty: errors, then an empty registry until the instances'
    next heartbeats. The last list is held for ``settle`` s, then the empty one applies."""
    key = unique_app("held")
    pub = EurekaPublisher(eureka.url, key, "127.0.0.1:50099", ttl=6).start()
    proxy, mode = _proxy(eureka.address)
    r, u = _resolver(f"eureka://127.0.0.1:{proxy.server_address[1]}/{key}?interval=0.2s", settle=3.0)
    d = _eureka(r)
    try:
        wait_until(lambda: u.addresses() == ["127.0.0.1:50099"], 15)
        mode["body"] = b"<html>502 Bad Gateway</html>"
        wait_until(lambda: d.failures >= 1, 15, what="the outage seen")
        mode["body"] = EMPTY_REGISTRY
        fetches = d.full_fetches + d.delta_fetches
        wait_until(lambda: d.full_fetches + d.delta_fetches >= fetches + 3, 15, what="the empty registry read")
        assert u.addresses() == ["127.0.0.1:50099"] and d.hold.holds == 1  # not emptied out of an outage
        wait_until(lambda: u.addresses() == [], 15, what="applied once it stayed empty for settle s")
        mode["body"] = None
        wait_until(lambda: u.addresses() == ["127.0.0.1:50099"], 15, what="back")
    finally:
        r.close()
        pub.stop()
        proxy.shutdown()


def test_cli_drain_on_an_eureka_registry_writes_the_status_override(eureka: EurekaServer) -> None:
    """``waypost drain/undrain`` with an ``eureka://`` registry: Eureka's status override, which takes the
    instance out of every client's list (waypost's here) and back, with no failed call."""
    from click.testing import CliRunner

    from tests.console.support import echo_serve
    from waypost.cli.commands import app

    name = unique_app("clidrain")
    a = echo_serve("a", name, eureka.url, ttl=6)
    b = echo_serve("b", name, eureka.url, ttl=6)
    try:
        wait_until(lambda: len(eureka.listed(name)) == 2, 30, what="both readable")
        with waypost.dial(f"eureka://{eureka.address}/{name}?interval=0.2s", balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            addresses = lambda: {sc.address for sc in ch.balancer.subconns()}
            wait_until(lambda: addresses() == {a.address, b.address}, 30, what="both in the client's list")
            run = CliRunner()
            res = run.invoke(app, ["--registry", eureka.url, "--json", "drain", name, a.address],
                             catch_exceptions=False)
            assert res.exit_code == 0, res.output
            done = json.loads(res.output.splitlines()[0])
            instance = f"{name.upper()}/{a.publisher.key}"
            assert done["registered"] is True and done["record"] is None  # no override record: Eureka's own override
            assert done["written"] == (f"Eureka's status override of {instance} set to OUT_OF_SERVICE: clients drop "
                                       "it at their next fetch"), done
            wait_until(lambda: eureka.statuses(name) == {a.publisher.key: "OUT_OF_SERVICE",
                                                         b.publisher.key: "UP"}, 15)
            failed = 0
            deadline = time.monotonic() + 30
            while addresses() != {b.address} and time.monotonic() < deadline:  # bounded
                try:
                    stub.Unary(echo_pb2.EchoRequest(), timeout=5)
                except grpc.RpcError:
                    failed += 1
                time.sleep(0.02)
            assert addresses() == {b.address} and failed == 0
            res = run.invoke(app, ["--registry", eureka.url, "undrain", name, a.address], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            assert res.stdout.strip().endswith(f": Eureka's status override of {instance} removed"), res.stdout
            assert "_waypost/override" not in res.stdout
            wait_until(lambda: addresses() == {a.address, b.address}, 30, what="back in the client's list")
    finally:
        a.stop()
        b.stop()
