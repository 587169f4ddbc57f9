"""The console's other sources and ways to run: a client's metrics as chart points, a dial target through its
resolver (read-only), several registries, the command itself (token, non-loopback warning) and HTTPS."""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest
from click.testing import CliRunner

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.console.support import echo_serve, http, instances, running_console, write
from waypost import metrics
from waypost.cli.commands import app
from waypost.console.clients import parse, point


def test_client_metrics_become_chart_points_per_backend(unique_key):
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = f"memory://{unique_key}"
    servers = [echo_serve(n, unique_key, reg) for n in ("a", "b")]
    exporter = metrics.serve(0, registry=prometheus_client.CollectorRegistry())
    try:
        murl = f"http://127.0.0.1:{exporter.server_port}/metrics"
        with waypost.dial(f"memory://{unique_key}/?key={unique_key}", balancer="round_robin") as ch, \
                running_console(registries=[reg], metrics=[murl], metrics_interval=0.3) as (_, url):
            stub = echo_pb2_grpc.EchoStub(ch)

            def charted() -> dict | None:
                for _ in range(20):
                    stub.Unary(echo_pb2.EchoRequest(), timeout=10)
                _, snap = http(f"{url}api/services")
                targets = snap["clients"][murl]["targets"]
                series = [p for t in targets.values() for p in t["series"] if sum(p["calls"].values())]
                return series[-1] if series else None

            last = wait_until(charted, 15, what="a chart point with calls")
            assert set(last["share"]) == {s.address for s in servers}
            assert abs(sum(last["share"].values()) - 1) < 1e-6
            assert all(0.2 < v < 0.8 for v in last["share"].values()), last  # round robin: about half each
            assert set(last["in_flight"]) == set(last["share"])
    finally:
        exporter.shutdown()
        metrics.disable()
        for s in servers:
            s.stop()


def test_metrics_text_parsing_and_a_failed_scrape():
    text = """# TYPE waypost_client_requests_total counter
waypost_client_requests_total{target="t",backend="a:1"} 30.0
waypost_client_requests_total{target="t",backend="b:1"} 10.0
waypost_client_in_flight{target="t",backend="a:1"} 2.0
waypost_client_latency_seconds_sum{target="t",backend="b:1"} 0.5
waypost_client_latency_seconds_count{target="t",backend="b:1"} 10.0
waypost_client_backend_latency_estimate_seconds{target="t",backend="a:1"} 0.02
"""
    now = parse(text)["t"]
    p = point({"a:1": {"requests": 10.0}, "b:1": {"requests": 0.0, "lat_sum": 0.0, "lat_count": 0.0}}, now, 1.0)
    assert p["calls"] == {"a:1": 20, "b:1": 10} and p["share"]["a:1"] == pytest.approx(2 / 3)
    assert p["latency"] == {"a:1": 0.02, "b:1": 0.05} and p["in_flight"]["a:1"] == 2.0
    with running_console(registries=[], metrics=["http://127.0.0.1:9/metrics"], metrics_interval=0.3) as (_, url):
        wait_until(lambda: http(f"{url}api/services")[1]["clients"]["http://127.0.0.1:9/metrics"]["error"], 10,
                   what="the scrape error shown")


def test_a_target_is_shown_read_only_next_to_several_registries(unique_key):
    reg1, reg2 = f"memory://{unique_key}-1", f"memory://{unique_key}-2"
    with echo_servers("d1", "d2") as direct:
        target = "direct:///" + ",".join(s.address for s in direct)
        a = echo_serve("a", unique_key, reg1)
        b = echo_serve("b", unique_key, reg2)
        try:
            with running_console(registries=[reg1, reg2], targets=[target]) as (_, url):
                def shown() -> dict:
                    return {(s["source"], s["format"]): s for s in http(f"{url}api/services")[1]["services"]}

                got = wait_until(lambda: len(s := shown()) == 3 and s, 10, what="three sources listed")
                t = got[(target, "resolver")]
                assert not t["writable"] and {i["address"] for i in t["instances"]} == {s.address for s in direct}
                assert got[(reg1, "gozero")]["writable"] and got[(reg2, "gozero")]["writable"]
                # a drain goes to the registry showing the instance, and only there
                assert write(url, "drain", {"key": unique_key, "address": b.address})[0] == 200
                wait_until(lambda: instances(url, unique_key)[b.address]["weight"] == 0, 10)
                assert instances(url, unique_key)[a.address]["weight"] == 100
                assert write(url, "drain", {"key": unique_key, "address": a.address, "source": "memory://x"})[0] == 404
                assert write(url, "undrain", {"key": unique_key, "address": b.address, "source": reg2})[0] == 200
        finally:
            a.stop()
            b.stop()


def test_the_command_prints_the_token_and_warns_off_loopback(unique_key):
    run = CliRunner()
    res = run.invoke(app, ["--json", "console", "--registry", f"memory://{unique_key}", "--listen", "127.0.0.1:0",
                           "--for", "0.5"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    event = json.loads(res.output.splitlines()[0])
    assert event["event"] == "serving" and len(event["token"]) >= 20 and event["url"].startswith("http://127.0.0.1:")
    res = run.invoke(app, ["console", "--registry", f"memory://{unique_key}", "--listen", "0.0.0.0:0", "--for", "0.5",
                           "--token", "given-token", "--read-only"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "not a loopback address" in res.output and "given-token" not in res.output
    assert "read-only" in res.output


def test_https(tmp_path, unique_key):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    with running_console(registries=[f"memory://{unique_key}"], tls_cert=str(cert_file),
                         tls_key=str(key_file)) as (_, url):
        assert url.startswith("https://")
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        with urllib.request.urlopen(f"{url}api/config", context=ctx, timeout=10) as resp:
            assert json.loads(resp.read())["read_only"] is False


def test_a_taken_port_is_one_error_line(unique_key):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app, ["console", "--registry", f"memory://{unique_key}", "--listen",
                                       f"127.0.0.1:{port}", "--for", "0.5"])
    assert res.exit_code == 1 and f"the console cannot listen on 127.0.0.1:{port}" in res.output, res.output
    assert "Traceback" not in res.output


def test_a_target_that_cannot_be_read_is_shown_with_its_error(unique_key):
    with running_console(registries=[f"memory://{unique_key}"], targets=["consul://127.0.0.1:9/nothing"],
                         timeout=1.0) as (_, url):
        def row() -> dict | None:
            return next((s for s in http(f"{url}api/services")[1]["services"] if s["key"] == "nothing"), None)

        got = wait_until(lambda: (r := row()) and r["error"] and r, 10, what="the error shown")
        assert "127.0.0.1:9" in got["error"] and got["instances"] == [] and not got["writable"]
