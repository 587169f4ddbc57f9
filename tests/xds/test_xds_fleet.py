"""The control plane in front of a fleet: ``--workers`` (processes sharing one port, each a whole control plane,
agreeing on versions; one killed is started again), and ``max_connection_age`` (connections are cycled, gRPC's
clients follow without a failed call)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.xds.test_xds_support import XdsServe, free_port, stock_client
from waypost.xds import ControlPlane, bootstrap_json, parse_export
from waypost.xds.resources import LISTENER

_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _streams_gauge(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("waypost_xds_streams "))


def _try_gauge(port: int) -> float | None:
    try:
        return _streams_gauge(port)
    except OSError:
        return None


def _listener_version(address: str) -> str:
    """A fresh connection's ADS answer to the Listener 'fleet' (each on its own connection: the kernel spreads
    them over the workers)."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        call = channel.stream_stream(_ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                     response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        # wait_for_ready: a connection the kernel queued on a worker as it was killed is reset, and the client
        # connects again (gRPC's xDS clients do the same with backoff)
        responses = call(iter([discovery_pb2.DiscoveryRequest(type_url=LISTENER, resource_names=["fleet"])]),
                         timeout=20, wait_for_ready=True)
        first = next(responses)
        responses.cancel()
        return first.version_info


def test_workers_share_one_port_agree_on_versions_and_a_killed_one_comes_back(tmp_path) -> None:
    metrics = free_port()
    serve = XdsServe(["fleet=direct:///127.0.0.1:1"], extra=("--workers", "2", "--metrics-port", str(metrics)),
                     log=tmp_path / "serve.log")
    try:
        assert serve.proc is not None
        workers = wait_until(lambda: (c := _children(serve.proc.pid)) and len(c) == 2 and c, 30, "2 workers")
        # streams held open on many connections: both workers get some (the kernel's SO_REUSEPORT spread)
        channels, calls, done = [], [], threading.Event()

        def requests():  # one subscription, then the stream stays open (no half-close) until the test ends
            yield discovery_pb2.DiscoveryRequest(type_url=LISTENER, resource_names=["fleet"])
            done.wait(30)

        for _ in range(24):
            ch = grpc.insecure_channel(serve.address, options=[("grpc.use_local_subchannel_pool", 1)])
            call = ch.stream_stream(_ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(
                requests(), timeout=30)
            channels.append(ch)
            calls.append(call)
        try:
            versions = {next(c).version_info for c in calls}
            assert len(versions) == 1, versions  # content-hashed: every worker sends the same version
            counts = wait_until(lambda: (n := [_streams_gauge(metrics), _streams_gauge(metrics + 1)]) and
                                sum(n) == 24 and n, 10, "24 streams over the two workers")
            assert min(counts) >= 1, counts
        finally:
            done.set()
            for c in calls:
                c.cancel()
            for ch in channels:
                ch.close()

        os.kill(serve.proc.pid, signal.SIGHUP)  # passed on to the workers (each re-reads --config): nobody dies
        time.sleep(0.5)
        assert serve.proc.poll() is None and _children(serve.proc.pid) == workers

        os.kill(workers[0], signal.SIGKILL)  # the supervisor starts it again; the other serves meanwhile
        assert _listener_version(serve.address) in versions
        wait_until(lambda: (c := _children(serve.proc.pid)) and len(c) == 2 and workers[0] not in c, 30,
                   "the killed worker started again")
        wait_until(lambda: _try_gauge(metrics) is not None, 30, "its metrics back")
        assert {_listener_version(serve.address) for _ in range(6)} == versions
        assert "worker 0 exited" in serve.log()
        code = serve.terminate()
        assert code == 0, serve.log()[-3000:]
        assert not _children(serve.proc.pid)
    finally:
        serve.close()


def test_connections_are_cycled_after_their_max_age_without_a_failed_call(tmp_path) -> None:
    with echo_servers("m1", "m2") as servers:
        export = parse_export("aged=direct:///" + ",".join(s.address for s in servers))
        control = ControlPlane([export], max_connection_age=1.0)
        port = control.start()
        try:
            seen: dict[int, object] = {}  # holding each stream keeps its id() from being reused
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "aged-test"), tmp_path) as client:
                client.start("aged", pause_ms=5)
                deadline = time.monotonic() + 8.0
                while time.monotonic() < deadline:
                    seen.update((id(s), s) for s in list(control.ads.streams))
                    time.sleep(0.05)
                events = client.stop()
            errors = [e for e in events if e[1].startswith("!")]
            assert not errors, errors[:5]
            assert {s for _, s in events} == {"m1", "m2"}
            assert len(seen) >= 2, "the client's stream was never cycled"
        finally:
            control.stop()
