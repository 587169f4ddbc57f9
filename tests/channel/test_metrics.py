"""waypost.metrics: off and free by default; Prometheus series from real channels, etcd restarts, lease loss,
compaction; no password in any label; a clear error without prometheus-client."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.tcp_proxy import TcpProxy
from harness.waiting import wait_until
from tests.channel.support import direct, echo_servers
from waypost import Publisher, _loop, metrics
from waypost.discovery import Subscriber
from waypost.etcd.config import EtcdConfig
from waypost.registries.etcd.store import EtcdRegistry

Req = echo_pb2.EchoRequest


@pytest.fixture
def prom():
    """Metrics enabled into a private CollectorRegistry for one test, disabled afterwards."""
    reg = CollectorRegistry()
    obs = metrics.enable(reg)
    try:
        yield obs
    finally:
        metrics.disable()


def value(obs, name: str, **labels) -> float:
    v = obs.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_disabled_by_default_and_prometheus_never_imported():
    # a fresh interpreter: registering, subscribing and dialing must not even import prometheus_client
    code = (
        "import sys, waypost\n"
        "from waypost import metrics\n"
        "assert metrics.current is None and metrics.observer() is None\n"
        "reg = waypost.connect('memory://m0')\n"
        "p = waypost.Publisher(reg, 'k.rpc', '127.0.0.1:1').start()\n"
        "s = waypost.Subscriber(reg, 'k.rpc')\n"
        "assert s.values() == ['127.0.0.1:1']\n"
        "ch = waypost.dial('memory://m0/?key=k.rpc')\n"
        "ch.close(); s.close(); p.stop()\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_enable_without_prometheus_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"waypost\[metrics\]"):
        metrics.enable(CollectorRegistry())
    assert metrics.current is None


def test_enable_is_idempotent_and_disable_unregisters():
    reg = CollectorRegistry()
    try:
        a = metrics.enable(reg)
        assert metrics.enable(reg) is a and metrics.enable() is a and metrics.current is a
        a.picker_rebuilt("direct:///x:1")
        assert b"waypost_client_picker_rebuilds_total" in generate_latest(reg)
    finally:
        metrics.disable()
    assert metrics.current is None
    assert b"waypost_" not in generate_latest(reg)


def test_call_hooks_record_requests_failures_latency_and_drop_removed_backends(prom):
    t = "etcd:///127.0.0.1:2379?key=k.rpc&user=app&password=s3cret-Pw"
    prom.call_done(t, "10.0.0.1:1", grpc.StatusCode.OK, 0.002)
    prom.call_done(t, "10.0.0.1:1", grpc.StatusCode.UNAVAILABLE, 0.2)
    prom.call_done(t, "10.0.0.2:1", grpc.StatusCode.OK, 0.004)
    prom.backend_ejected("10.0.0.1:1", t)
    prom.picker_rebuilt(t)
    label = prom.target_label(t)
    assert "s3cret-Pw" not in label and "***" in label
    assert value(prom, "waypost_client_requests_total", target=label, backend="10.0.0.1:1") == 2
    assert value(prom, "waypost_client_failures_total", target=label, backend="10.0.0.1:1", code="UNAVAILABLE") == 1
    assert value(prom, "waypost_client_latency_seconds_count", target=label, backend="10.0.0.1:1") == 2
    assert value(prom, "waypost_client_latency_seconds_bucket", target=label, backend="10.0.0.1:1", le="0.0025") == 1
    assert value(prom, "waypost_client_ejections_total", target=label, backend="10.0.0.1:1") == 1
    assert value(prom, "waypost_client_picker_rebuilds_total", target=label) == 1
    assert b"s3cret-Pw" not in generate_latest(prom.registry)
    prom.backend_removed(t, "10.0.0.1:1")
    text = generate_latest(prom.registry).decode()
    assert "10.0.0.1:1" not in text and "10.0.0.2:1" in text


def test_in_flight_and_backend_states_are_read_from_live_channels(prom):
    with echo_servers("a", "b") as servers:
        target = direct(servers)
        with waypost.dial(target, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            stub.Unary(Req(), timeout=10, wait_for_ready=True)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20)
            assert value(prom, "waypost_client_backends", target=target, state="READY") == 2
            fut = stub.Unary.future(Req(delay_ms=1500), timeout=20)
            busy = wait_until(lambda: [sc.address for sc in ch.balancer.subconns() if sc.inflight], 10)[0]
            assert value(prom, "waypost_client_in_flight", target=target, backend=busy) == 1
            fut.result()
            assert value(prom, "waypost_client_in_flight", target=target, backend=busy) == 0
        # a closed channel is no longer reported
        assert value(prom, "waypost_client_backends", target=target, state="READY") == 0


def test_live_sources_are_read_at_scrape_time_and_a_failing_one_is_logged_and_skipped(prom, caplog):
    target = "direct:///10.0.0.9:1"

    def broken():
        raise RuntimeError("source down")

    def one_channel():
        return [metrics.ChannelSample(target, {"READY": 1, "IDLE": 0}, [("10.0.0.9:1", 3)])]

    for source in (broken, one_channel, one_channel):  # registering twice reads it once
        metrics.register_live_source(source)
    try:
        text = generate_latest(prom.registry).decode()
        assert text.count('waypost_client_in_flight{backend="10.0.0.9:1",target="direct:///10.0.0.9:1"} 3.0') == 1
        assert value(prom, "waypost_client_backends", target=target, state="READY") == 1
        assert value(prom, "waypost_client_backends", target=target, state="IDLE") == 0
        assert "metrics live source failed" in caplog.text and "source down" in caplog.text
    finally:
        metrics.unregister_live_source(broken)
        metrics.unregister_live_source(one_channel)
    assert "10.0.0.9:1" not in generate_latest(prom.registry).decode()


def test_serve_exposes_metrics_over_http():
    reg = CollectorRegistry()
    try:
        server = metrics.serve(0, registry=reg)
        try:
            metrics.current.registry_reconnect("watch")
            body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read()
            assert b'waypost_registry_reconnects_total{stream="watch"} 1.0' in body
        finally:
            server.shutdown()
            server.server_close()
    finally:
        metrics.disable()


def test_etcd_restart_counts_stream_reconnects(prom, etcd):
    reg = EtcdRegistry(EtcdConfig(endpoints=(etcd.endpoint,)))
    pub = Publisher(reg, "mr.rpc", "127.0.0.1:7001", ttl=5).start()
    sub = Subscriber(reg, "mr.rpc")
    try:
        etcd.members[0].restart()
        assert wait_until(lambda: value(prom, "waypost_registry_reconnects_total", stream="watch") >= 1
                          and value(prom, "waypost_registry_reconnects_total", stream="keepalive") >= 1, 30)
        pub.stop()
        assert wait_until(lambda: sub.values() == [], 30)  # the watch works again
    finally:
        sub.close()
        pub.stop()
        _loop.run(reg.close(), 10)


def test_lease_loss_outside_delete_and_compaction_are_counted(prom, etcd):
    reg = EtcdRegistry(EtcdConfig(endpoints=(etcd.endpoint,)))
    proxy = TcpProxy((etcd.members[0].host, etcd.members[0].client_port))
    cut_reg = EtcdRegistry(EtcdConfig(endpoints=(proxy.endpoint,)))
    pub = Publisher(reg, "ml.rpc", "127.0.0.1:7002", ttl=5).start()
    sub = Subscriber(cut_reg, "ml.rpc")
    try:
        # someone deletes our key: put back, counted
        reg.sync.delete(pub.key)
        assert wait_until(lambda: value(prom, "waypost_registrations_restored_total", key="ml.rpc") == 1, 20)
        # the lease is revoked from outside: registered again with a new lease, counted
        reg.sync.revoke(pub.lease_id)
        assert wait_until(lambda: value(prom, "waypost_lease_reregistrations_total", key="ml.rpc") == 1, 20)
        # a subscriber cut off while its history is compacted away reloads, counted as "compacted"
        proxy.cut()
        for i in range(5):
            reg.sync.put(f"ml.rpc/x{i}", b"127.0.0.1:9")
        etcd.compact()
        proxy.restore()
        assert wait_until(
            lambda: value(prom, "waypost_watch_reloads_total", key="ml.rpc/", reason="compacted") >= 1, 30)
        assert wait_until(lambda: sorted(sub.values()) == ["127.0.0.1:7002", "127.0.0.1:9"], 20)
    finally:
        sub.close()
        pub.stop()
        _loop.run(reg.close(), 10)
        _loop.run(cut_reg.close(), 10)
        proxy.close()


def test_channels_report_calls_rebuilds_and_removals(prom):
    """The hooks are wired: real calls through sync and aio channels land in the series."""
    import asyncio

    with echo_servers("a", "b") as servers:
        target = direct(servers)
        with waypost.dial(target, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            for _ in range(6):
                stub.Unary(Req(), timeout=10, wait_for_ready=True)
            with pytest.raises(grpc.RpcError):
                stub.Unary(Req(error_code=grpc.StatusCode.INTERNAL.value[0]), timeout=10)
            ok = sum(value(prom, "waypost_client_requests_total", target=target, backend=s.address) for s in servers)
            failed = sum(value(prom, "waypost_client_failures_total", target=target, backend=s.address,
                               code="INTERNAL") for s in servers)
            assert ok == 7 and failed == 1
            assert value(prom, "waypost_client_picker_rebuilds_total", target=target) >= 1

        async def aio_calls() -> None:
            async with waypost.aio.dial(target, balancer="round_robin") as ach:
                astub = echo_pb2_grpc.EchoStub(ach)
                for _ in range(4):
                    await astub.Unary(Req(), timeout=10, wait_for_ready=True)
                total = sum(value(prom, "waypost_client_requests_total", target=target, backend=s.address)
                            for s in servers)
                assert total == 4  # the sync channel's series went with its backends when it closed

        asyncio.run(aio_calls())
        assert sum(value(prom, "waypost_client_requests_total", target=target, backend=s.address)
                   for s in servers) == 0
