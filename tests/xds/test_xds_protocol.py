"""The ADS protocol against real clients: a NACKed resource (the last good one stays in force), a subscription to a
name that is not exported, and the push cost of 1,000 endpoints to 100 streams. The control plane runs in this
process (``ControlPlane``); the grpcio client is the stock process of ``test_xds_support``."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.xds.test_xds_support import stock_client
from waypost import _loop
from waypost.xds import ControlPlane, bootstrap_json, parse_export
from waypost.xds.policy import _typed
from waypost.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE
from waypost.xds.snapshot import Resource


def _inject(control: ControlPlane, name: str, type_url: str, msg) -> None:
    """Test hook: replace one served resource and push (as a change in a source would)."""
    def swap() -> None:
        if type_url == ENDPOINT:
            control._eds[name] = Resource.of(name, msg)
        else:
            control._static[name][type_url] = Resource.of(name, msg)
        control._rebuild()

    _loop.call_soon(swap)


def _cds_states(control: ControlPlane) -> list:
    return [s.state.types[CLUSTER] for s in list(control.ads.streams) if CLUSTER in s.state.types]


def test_nacked_resource_keeps_the_last_good_one(tmp_path, caplog) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from waypost import metrics

    registry = prometheus_client.CollectorRegistry()
    metrics.enable(registry)
    try:
        _nack_scenario(tmp_path, caplog)
        value = registry.get_sample_value
        assert value("waypost_xds_nacks_total", {"type": "CDS"}) == 1
        assert value("waypost_xds_pushes_total", {"type": "EDS"}) >= 1
        assert value("waypost_xds_resources", {"type": "LDS"}) == 1
        assert value("waypost_xds_push_seconds_count") >= 1  # the source's first list, pushed
        assert value("waypost_xds_streams") == 0  # the client's stream ended with it
    finally:
        metrics.disable()


def _nack_scenario(tmp_path, caplog) -> None:
    with echo_servers("n1", "n2") as servers:
        export = parse_export("nk=direct:///" + ",".join(s.address for s in servers))
        control = ControlPlane([export])
        port = control.start()
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "nack-test"), tmp_path) as client:
                wait_until(lambda: client.calls("nk", 20)["servers"] == {"n1": 10, "n2": 10}, 10, "round robin")
                good = wait_until(lambda: [t.acked_version for t in _cds_states(control) if t.acked_version], 10)[0]
                # least_request alone: grpcio has no such policy and rejects the Cluster
                bad = cluster_pb2.Cluster()
                bad.CopyFrom(_cluster(export))
                del bad.load_balancing_policy.policies[:]
                from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2

                bad.load_balancing_policy.policies.append(
                    _typed("envoy.load_balancing_policies.least_request", least_request_pb2.LeastRequest()))
                with caplog.at_level(logging.WARNING, logger="waypost.xds"):
                    _inject(control, "nk", CLUSTER, bad)
                    wait_until(lambda: control.ads.nacks >= 1, 10, "the client rejects the Cluster")
                state = _cds_states(control)[0]
                assert state.nacks == 1 and state.acked_version == good and state.nacked_version != good
                assert any("rejected CDS" in r.getMessage() for r in caplog.records)
                got = client.calls("nk", 20)  # the last good Cluster stays in force
                assert got["servers"] == {"n1": 10, "n2": 10} and not got["errors"], got
                # a good change after the NACK is accepted
                fixed = _cluster(parse_export("nk=direct:///127.0.0.1:1 policy=pick_first"))
                _inject(control, "nk", CLUSTER, fixed)
                wait_until(lambda: _cds_states(control)[0].acked_version == _cds_states(control)[0].sent_version
                           != state.nacked_version, 10, "the fixed Cluster is ACKed")
                wait_until(lambda: len(client.calls("nk", 10)["servers"]) == 1, 10, "pick_first in force")
        finally:
            control.stop()


def _cluster(export):
    from waypost.xds.resources import cluster

    return cluster(export)


def test_a_name_not_exported_fails_at_once_and_is_served_once_exported(tmp_path, caplog) -> None:
    """A typo'd ``xds:///NAME`` fails with UNAVAILABLE naming it within a 3 s deadline, shorter than the client's
    15 s does-not-exist timer (unanswered, the call ended DEADLINE_EXCEEDED), both on a stream subscribed only to
    it and beside a served name; it is logged once with the exported names; exported later, it is served to the
    same client. A service whose source answered with nothing fails its calls at once too (an empty
    assignment)."""
    with echo_servers("u1") as servers:
        control = ControlPlane([parse_export(f"known=direct:///{servers[0].address}"),
                                parse_export(f"empty=memory://xds-empty-{time.monotonic_ns()}/?key=none.rpc")])
        port = control.start()
        try:
            with caplog.at_level(logging.WARNING, logger="waypost.xds"), \
                    stock_client(bootstrap_json([f"127.0.0.1:{port}"], "unknown-test"), tmp_path) as client:
                alone = client.timed("nope", 3.0)  # the stream's only subscription
                assert alone["code"] == "UNAVAILABLE" and "nope" in alone["details"], alone
                assert client.calls("known", 3)["servers"] == {"u1": 3}  # the stream goes on
                beside = client.timed("greter", 3.0)  # beside a served name
                assert beside["code"] == "UNAVAILABLE" and "greter" in beside["details"], beside
                assert client.calls("known", 3)["servers"] == {"u1": 3}
                control.add_export(parse_export(f"nope=direct:///{servers[0].address}"))
                wait_until(lambda: client.calls("nope", 1)["servers"] == {"u1": 1}, 20, "nope served once exported")
                empty = client.timed("empty", 3.0)
                assert empty["code"] == "UNAVAILABLE", empty
            print(f"\nnot exported: grpcio failed the call after {alone['seconds'] * 1000:.0f} ms (only subscription), "
                  f"{beside['seconds'] * 1000:.0f} ms (beside a served one): {beside['details']}")
            logged = [r.getMessage() for r in caplog.records if "not exported" in r.getMessage()]
            assert len([m for m in logged if "'nope'" in m]) == 1 and "known" in logged[0], logged
        finally:
            control.stop()


async def _open_streams(port: int, n: int, name: str) -> tuple[list, list]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    method = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
    calls = []
    for i in range(n):
        call = method()
        await call.write(discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id=f"load-{i}"), type_url=ENDPOINT, resource_names=[name]))
        calls.append(call)
    first = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
    return [channel, calls], list(first)


def test_push_cost_1000_endpoints_100_streams() -> None:
    """One endpoint changes in a service of 1,000: the new assignment reaches 100 streams (the figure is printed)."""
    import waypost

    reg = waypost.connect(f"memory://xds-load-{time.monotonic_ns()}")
    for i in range(1000):
        _loop.run(reg.put(f"big.rpc/{i}", f"10.{i // 250}.{i % 250}.1:8080".encode()))
    control = ControlPlane([parse_export(f"big={reg.url}/?key=big.rpc")])
    port = control.start()

    async def scenario() -> tuple[float, int, int]:
        (channel, calls), first = await _open_streams(port, 100, "big")
        assert all(len(endpoint_pb2.ClusterLoadAssignment.FromString(r.resources[0].value).endpoints[0].lb_endpoints)
                   == 1000 for r in first[:3])
        for c, r in zip(calls, first):  # ACK, as a client does
            await c.write(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["big"],
                                                         version_info=r.version_info, response_nonce=r.nonce))
        started = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: _loop.run(reg.put("big.rpc/new", b"10.9.9.9:8080")))
        second = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
        took = time.perf_counter() - started
        cla = endpoint_pb2.ClusterLoadAssignment.FromString(second[0].resources[0].value)
        size = len(second[0].SerializeToString())
        for c in calls:
            c.cancel()
        await channel.close()
        return took, sum(len(e.lb_endpoints) for e in cla.endpoints), size

    try:
        took, endpoints, size = asyncio.run(scenario())
    finally:
        control.stop()
    build = control.stats["last_push_seconds"]
    print(f"\npush cost: 1,001 endpoints ({size / 1024:.0f} KiB response) to 100 streams: snapshot built and queued "
          f"in {build * 1000:.1f} ms, every stream had the change {took * 1000:.0f} ms after the registry write")
    assert endpoints == 1001
    assert control.stats["last_push_responses"] == 100
    assert took < 30  # generous (a loaded 2-core machine); the figure above is the measurement


def test_service_config_retries_are_honoured(tmp_path) -> None:
    """A methodConfig retryPolicy reaches grpcio as the route's retry_policy: calls that one server fails with
    UNAVAILABLE are retried on the other; the same servers exported without it fail those calls."""
    sc = {"methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    with echo_servers("r1", "r2") as servers:
        from waypost.xds.exports import make_export

        target = "direct:///" + ",".join(s.address for s in servers)
        control = ControlPlane([make_export("retrying", target, {"service_config": sc}),
                                parse_export(f"plain={target}")])
        port = control.start()
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "retry-test"), tmp_path) as client:
                wait_until(lambda: set(client.calls("retrying", 10)["servers"]) == {"r1", "r2"}, 20, "both ready")
                wait_until(lambda: set(client.calls("plain", 10)["servers"]) == {"r1", "r2"}, 20, "both ready")
                got = client.calls("retrying", 20, fail_on="r1")
                assert got == {"servers": {"r2": 20}, "errors": []}, got
                plain = client.calls("plain", 20, fail_on="r1")
                assert plain["errors"] and set(plain["errors"]) == {"!UNAVAILABLE"}, plain
        finally:
            control.stop()


async def _ask_all(port: int, name: str) -> dict[str, str]:
    """One stream asking for each type in turn (as a client does): the version of each answer."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
    versions = {}
    try:
        for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT):
            await call.write(discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="replica-check"), type_url=t,
                                                            resource_names=[name]))
            r = await asyncio.wait_for(call.read(), 20)
            versions[t] = r.version_info
        return versions
    finally:
        call.cancel()
        await channel.close()


def test_two_replicas_serve_the_same_versions(shared_etcd, unique_key) -> None:
    """Replicas with the same exports over the same registry answer with the same version for every type (versions
    come from content), so a client failing over sees no change."""
    from tests.xds.test_xds_support import Backends

    b = Backends(shared_etcd.url(), unique_key)
    b.add("v1", zone="a")
    b.add("v2", weight=7)
    spec = f"svc=etcd:///{shared_etcd.endpoint}?key={unique_key} policy=ring_hash hash_header=x-k"
    replicas = [ControlPlane([parse_export(spec)]) for _ in range(2)]
    try:
        ports = [r.start() for r in replicas]
        wait_until(lambda: all(len(r.endpoints("svc") or ()) == 2 for r in replicas), 20, "both replicas read etcd")
        first, second = (asyncio.run(_ask_all(p, "svc")) for p in ports)
        assert first == second and all(first.values()), (first, second)
    finally:
        for r in replicas:
            r.stop()
        b.close()


def test_grpcio_accepts_every_policy_and_outlier_detection(tmp_path) -> None:
    """Each export policy (and outlier detection) as sent is accepted by grpcio (no NACK) and serves calls."""
    from waypost.xds.exports import make_export

    with echo_servers("p1", "p2") as servers:
        target = "direct:///" + ",".join(s.address for s in servers)
        exports = [make_export(p, target, {"policy": p}) for p in (
            "round_robin", "pick_first", "ring_hash", "least_request", "client_side_weighted_round_robin")]
        exports.append(make_export("ejecting", target, {"outlier_detection": {
            "interval": "1s", "failurePercentageEjection": {"threshold": 50, "minimumHosts": 2, "requestVolume": 5}}}))
        # a host name among the endpoints is left out (grpcio would reject the whole assignment for it)
        exports.append(make_export("named", f"direct:///localhost:{servers[0].port},{servers[1].address}", {}))
        exports.append(make_export("weighted", target, {"policy": "client_side_weighted_round_robin", "policy_config": {
            "enableOobLoadReport": False, "blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s"}}))
        control = ControlPlane(exports)
        port = control.start()
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "policies"), tmp_path) as client:
                for e in exports:
                    got = client.calls(e.name, 6)
                    assert not got["errors"] and set(got["servers"]) <= {"p1", "p2"}, (e.name, got)
                assert control.ads.nacks == 0
        finally:
            control.stop()
