"""Client status (CSDS, ``envoy.service.status.v3.ClientStatusDiscoveryService``) and ``waypost xds status``
against real clients: a stock grpcio client and a grpc-go one that ACK everything, a raw stream that NACKs a
Cluster with a message, and one subscribed to an assignment that is never sent."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from envoy.type.matcher.v3 import node_pb2, string_pb2

from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.xds.go_peers import go_timeout_mark
from tests.xds.peer_procs import ROOT, fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.test_xds_support import _env, stock_client
from tests.xds.xds_peers import start_xds_client
from waypost.xds import ControlPlane, bootstrap_json, parse_export
from waypost.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE

_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


class RawStream:
    """An ADS stream driven by hand (requests put on a queue, responses read one by one)."""

    def __init__(self, port: int, node_id: str) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.requests: queue.Queue[Any] = queue.Queue()
        self.node_id = node_id

        def gen() -> Iterator[Any]:
            while (item := self.requests.get()) is not None:
                yield item

        self.responses = self.channel.stream_stream(
            _ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(gen(), timeout=120)

    def ask(self, type_url: str, name: str, **kw: Any) -> None:
        self.requests.put(discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=[name],
                                                         node={"id": self.node_id, "cluster": "raw"}, **kw))

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


@pytest.fixture(name="plane")
def fixture_plane(tmp_path) -> Iterator[dict[str, Any]]:
    with echo_servers("c1", "c2") as servers:
        control = ControlPlane([parse_export("st=direct:///" + ",".join(s.address for s in servers))])
        port = control.start()
        raws: list[RawStream] = []
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "csds-grpcio", zone="z1"), tmp_path) as client:
                wait_until(lambda: set(client.calls("st", 10)["servers"]) == {"c1", "c2"}, 20, "calls through xDS")
                nacker = RawStream(port, "csds-nacker")
                raws.append(nacker)
                nacker.ask(CLUSTER, "st")
                first = next(nacker.responses)
                nacker.ask(CLUSTER, "st", version_info="", response_nonce=first.nonce,
                           error_detail={"code": 3, "message": "cluster st: not for me (test NACK)"})
                waiting = RawStream(port, "csds-waiting")
                raws.append(waiting)
                waiting.ask(ENDPOINT, "nowhere")  # not exported: an assignment is never sent
                wait_until(lambda: len(control.ads.streams) == 3 and all(
                    s.state.node_id for s in control.ads.streams), 20, "three streams with nodes")
                wait_until(lambda: any(ts.nacks for s in control.ads.streams for ts in s.state.types.values()),
                           20, "the NACK in")
                yield {"port": port, "control": control, "first_cds_version": first.version_info}
        finally:
            for r in raws:
                r.close()
            control.stop()


def _fetch(port: int, request: csds_pb2.ClientStatusRequest | None = None) -> csds_pb2.ClientStatusResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return csds_pb2_grpc.ClientStatusDiscoveryServiceStub(ch).FetchClientStatus(
            request or csds_pb2.ClientStatusRequest(), timeout=10)


def _by_node(resp: csds_pb2.ClientStatusResponse) -> dict[str, Any]:
    return {c.node.id: {(g.type_url, g.name): g for g in c.generic_xds_configs} for c in resp.config}


def test_fetch_client_status_lists_every_client_with_its_acks_and_nacks(plane) -> None:
    resp = _fetch(plane["port"])
    nodes = _by_node(resp)
    assert set(nodes) == {"csds-grpcio", "csds-nacker", "csds-waiting"}
    grpcio = nodes["csds-grpcio"]
    assert set(grpcio) == {(LISTENER, "st"), (ROUTE, "st"), (CLUSTER, "st"), (ENDPOINT, "st")}
    assert all(g.config_status == csds_pb2.SYNCED and g.client_status == 3 for g in grpcio.values())  # ACKED
    assert all(g.version_info and g.xds_config.type_url == t for (t, _), g in grpcio.items())
    zone = next(c.node.locality.zone for c in resp.config if c.node.id == "csds-grpcio")
    assert zone == "z1"  # the whole Node, as the client sent it
    nacked = nodes["csds-nacker"][(CLUSTER, "st")]
    assert nacked.config_status == csds_pb2.ERROR and nacked.client_status == 4  # NACKED
    assert nacked.error_state.details == "cluster st: not for me (test NACK)"
    assert nacked.error_state.version_info == plane["first_cds_version"]
    never = nodes["csds-waiting"][(ENDPOINT, "nowhere")]
    assert never.config_status == csds_pb2.NOT_SENT and not never.version_info


def test_node_matchers_filter_and_an_unsupported_one_is_refused(plane) -> None:
    prefix = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(
        node_id=string_pb2.StringMatcher(prefix="csds-n"))])
    assert [c.node.id for c in _fetch(plane["port"], prefix).config] == ["csds-nacker"]
    regex = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(
        node_id=string_pb2.StringMatcher(safe_regex={"regex": "csds-(grpcio|waiting)"}))])
    assert sorted(c.node.id for c in _fetch(plane["port"], regex).config) == ["csds-grpcio", "csds-waiting"]
    custom = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(
        node_id=string_pb2.StringMatcher(custom={"name": "my.matcher"}))])
    with pytest.raises(grpc.RpcError) as err:
        _fetch(plane["port"], custom)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "custom" in err.value.details()


def test_stream_client_status_answers_each_request(plane) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{plane['port']}") as ch:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(ch)
        only = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(
            node_id=string_pb2.StringMatcher(exact="csds-waiting"))])
        answers = list(stub.StreamClientStatus(iter([csds_pb2.ClientStatusRequest(), only]), timeout=10))
    assert [len(a.config) for a in answers] == [3, 1]


def _status_cli(port: int, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args, "xds", "status", "--server",
                           f"127.0.0.1:{port}"], cwd=ROOT, env=_env(COLUMNS=str(columns)), capture_output=True,
                          text=True, timeout=60, check=False)


def test_waypost_xds_status_prints_a_row_per_client_and_the_nack(plane) -> None:
    out = _status_cli(plane["port"])
    assert out.returncode == 0, out.stderr
    text = out.stdout
    print("\n" + text)
    for node in ("csds-grpcio", "csds-nacker", "csds-waiting"):
        assert node in text
    assert "SYNCED" in text and "NACKED" in text and "not for me (test NACK)" in text
    assert "'nowhere' subscribed, not sent" in text
    as_json = _status_cli(plane["port"], "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert {c["node"]["id"] for c in json.loads(as_json.stdout)["config"]} == {
        "csds-grpcio", "csds-nacker", "csds-waiting"}


def test_waypost_xds_status_to_a_pipe_never_wraps_a_cell(plane) -> None:
    """Not on a terminal (here a pipe 40 columns wide), each client is one line with its node id and versions
    whole: a plain table, columns padded with spaces."""
    out = _status_cli(plane["port"], columns=40)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    print("\n" + out.stdout)
    assert lines[0] == f"127.0.0.1:{plane['port']}  (3 clients)"
    assert lines[1].split() == ["NODE", "TARGET", "CLUSTER", "ZONE", "LDS", "RDS", "CDS", "EDS"]
    grpcio = _by_node(_fetch(plane["port"]))["csds-grpcio"]
    versions = {t: g.version_info[:8] for (t, _), g in grpcio.items()}
    row = next(line for line in lines if line.startswith("csds-grpcio "))
    assert row.split() == ["csds-grpcio", "xds:///st", "waypost", "z1"] + [
        part for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT) for part in ("SYNCED", f"({versions[t]})")], row
    waiting = next(line for line in lines if line.startswith("csds-waiting "))
    assert waiting.split() == ["csds-waiting", "-", "raw", "-", "-", "-", "-", "NOT", "SENT"], waiting
    assert row.index("SYNCED") == lines[1].index("LDS") and waiting.index("NOT SENT") == lines[1].index("EDS")
    assert not any(ch in out.stdout for ch in "┃│━")  # no box drawing


def test_waypost_xds_status_says_what_is_wrong_with_the_server() -> None:
    with echo_servers("plain") as servers:  # a gRPC server, not a control plane
        port = int(servers[0].address.rsplit(":", 1)[1])
        out = _status_cli(port)
    assert out.returncode != 0 and "is not an xDS control plane with CSDS" in out.stderr, out.stderr


@go_timeout_mark()
@pytest.mark.usefixtures("xds_procs")
def test_a_grpc_go_client_is_listed_synced(plane) -> None:
    boot = bootstrap_json([f"127.0.0.1:{plane['port']}"], "csds-go")
    run = start_xds_client("go", "xds:///st", boot, 100_000, interval=0.01, batch=20)
    try:
        run.progress(60.0)
        nodes = wait_until(lambda: (n := _by_node(_fetch(plane["port"]))).get("csds-go") and len(n["csds-go"]) == 4
                           and all(g.config_status == csds_pb2.SYNCED for g in n["csds-go"].values()) and n, 20,
                           "the go client's four resources SYNCED")
        assert {t for t, _ in nodes["csds-go"]} == {LISTENER, ROUTE, CLUSTER, ENDPOINT}
        out = _status_cli(plane["port"])
        assert "csds-go" in out.stdout, out.stdout
    finally:
        run.stop()


# -- several targets in one process: one ADS stream per target, each served and listed ----------------------


@pytest.fixture(name="two")
def fixture_two() -> Iterator[dict[str, Any]]:
    """A control plane exporting ta (server a1) and tb (server b1)."""
    with echo_servers("a1", "b1") as (a, b):
        control = ControlPlane([parse_export(f"ta=direct:///{a.address}"), parse_export(f"tb=direct:///{b.address}")])
        port = control.start()
        try:
            yield {"port": port, "control": control, "a": a.address, "b": b.address}
        finally:
            control.stop()


def _streams_of(port: int, node: str) -> dict[str, dict[tuple[str, str], Any]]:
    """The node's ClientConfigs by client_scope: {scope: {(type, name): GenericXdsConfig}}."""
    return {c.client_scope: {(g.type_url, g.name): g for g in c.generic_xds_configs}
            for c in _fetch(port).config if c.node.id == node}


def _each_target_synced(port: int, node: str) -> dict[str, Any] | None:
    got = _streams_of(port, node)
    want = {f"xds:///{n}": {(t, n) for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT)} for n in ("ta", "tb")}
    ok = {s: set(c) for s, c in got.items()} == want and all(
        g.config_status == csds_pb2.SYNCED for c in got.values() for g in c.values())
    return got if ok else None


def _status_rows(port: int, node: str) -> list[list[str]]:
    out = _status_cli(port)
    assert out.returncode == 0, out.stderr
    print("\n" + out.stdout)
    return [line.split() for line in out.stdout.splitlines() if line.startswith(node + " ")]


def test_two_targets_in_one_grpcio_process_are_two_streams_each_served_and_listed(two, tmp_path) -> None:
    """grpcio 1.85 opens one xDS client per target: two ``xds:///`` channels in one process are two ADS streams of
    the same node id over one connection. Each gets its own target's resources (its calls reach its server),
    CSDS lists each with its client_scope, ``waypost xds status`` one row per target."""
    control, port = two["control"], two["port"]
    with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "two-grpcio"), tmp_path) as client:
        assert client.calls("ta", 20) == {"servers": {"a1": 20}, "errors": []}
        assert client.calls("tb", 20) == {"servers": {"b1": 20}, "errors": []}
        got = wait_until(lambda: _each_target_synced(port, "two-grpcio"), 20, "both streams SYNCED in CSDS")
        streams = [s for s in control.ads.streams if s.state.node_id == "two-grpcio"]
        peers = {s.state.peer for s in streams}
        print(f"\ngrpcio, two targets: {len(streams)} streams of node two-grpcio from {sorted(peers)}; "
              f"CSDS scopes {sorted(got)}")
        assert len(streams) == 2
        rows = _status_rows(port, "two-grpcio")
        assert sorted(r[1] for r in rows) == ["xds:///ta", "xds:///tb"] and all(
            r.count("SYNCED") == 4 for r in rows), rows
        # a change reaches each stream: the two exports swap their servers
        control.replace_exports([parse_export(f"ta=direct:///{two['b']}"), parse_export(f"tb=direct:///{two['a']}")])
        wait_until(lambda: client.calls("ta", 10)["servers"] == {"b1": 10} and
                   client.calls("tb", 10)["servers"] == {"a1": 10}, 20, "both targets follow the swap")


@go_timeout_mark()
@pytest.mark.usefixtures("xds_procs")
def test_two_targets_in_one_grpc_go_process_are_two_streams_each_served_and_listed(two) -> None:
    """grpc-go 1.85 (one xDS client per data-plane target): the same, from ``xds-targets`` dialing ta and tb."""
    from tests.xds.go_peers import go_programs
    from tests.xds.orca_peers import client_args
    from tests.xds.peer_procs import PeerProc

    control, port = two["control"], two["port"]
    boot = bootstrap_json([f"127.0.0.1:{port}"], "two-go")
    argv = [str(go_programs()["xds-targets"]), "-target", "xds:///ta", "-target", "xds:///tb",
            *client_args(20, 0, 0.0, 10.0, None, 0, True, 60.0)]
    run = PeerProc(argv, "xds-targets-go", env={"GRPC_XDS_BOOTSTRAP_CONFIG": boot})
    try:
        finals = {}
        for target in ("xds:///ta", "xds:///tb"):
            run.expect(lambda d, t=target: d.get("target") == t, 60, f"the {target} line")
            finals[target] = run.expect(lambda d: "calls" in d or "fatal" in d, 60, "its final line")
        run.expect(lambda d: "holding" in d, 30, "holding")
        assert finals["xds:///ta"]["counts"] == {"a1": 20} and finals["xds:///tb"]["counts"] == {"b1": 20}, finals
        got = wait_until(lambda: _each_target_synced(port, "two-go"), 20, "both streams SYNCED in CSDS")
        streams = [s for s in control.ads.streams if s.state.node_id == "two-go"]
        print(f"\ngrpc-go, two targets: {len(streams)} streams of node two-go from "
              f"{sorted(s.state.peer for s in streams)}; CSDS scopes {sorted(got)}")
        assert len(streams) == 2
        rows = _status_rows(port, "two-go")
        assert sorted(r[1] for r in rows) == ["xds:///ta", "xds:///tb"], rows
    finally:
        run.stop()
