"""waypost's ORCA against grpc-go (real peers from tests/xds/orca_peers.py):

(a) grpc-go's weighted_round_robin over three waypost servers reporting cpu 0.9/0.3/0.1 at 100 rps splits as A58
    predicts, per call and out of band;
(b) waypost's weighted_round_robin over three grpc-go orca-servers (grpc-go's own orca package) splits the same
    way out of band. Per call it cannot: grpcio's C-core consumes ``endpoint-load-metrics-bin`` on the client and
    never hands it to Python, and grpc-go servers send no ``waypost-load-metrics-bin``, so waypost sees no
    per-call report from them and spreads calls evenly (the documented limit, checked here).
"""

from __future__ import annotations

import collections
import time
from concurrent import futures

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from tests.xds.go_peers import go_timeout_mark
from tests.xds.orca_peers import run_wrr_client, start_orca_server, wrr_config
from tests.xds.peer_procs import fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from waypost import orca

pytestmark = [go_timeout_mark(), pytest.mark.usefixtures("xds_procs"), pytest.mark.interop]

LOADS = {"hot": 0.9, "warm": 0.3, "cool": 0.1}
#: A58: weight = qps / utilization; 100 rps each -> 111/333/1000 -> of 600 calls
EXPECTED = {"hot": 600 * 111.1 / 1444.4, "warm": 600 * 333.3 / 1444.4, "cool": 600 * 1000 / 1444.4}


def _check(counts: dict[str, int], label: str) -> None:
    print(f"{label}: {counts} (A58 expects {', '.join(f'{k} {v:.0f}' for k, v in EXPECTED.items())})")
    assert sum(counts.values()) == 600, counts
    for name, want in EXPECTED.items():
        assert abs(counts.get(name, 0) - want) <= max(0.25 * want, 20), (label, counts)


def _serve_waypost(per_call: bool) -> list:  # type: ignore[type-arg]
    orca.configure(min_interval=0.05, per_call=per_call)
    handles = []
    try:
        for name, cpu in LOADS.items():
            server = grpc.server(futures.ThreadPoolExecutor(8))
            echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
            h = waypost.serve(server, "orca.go", listen_on="127.0.0.1:0", registry=None)
            h.orca_recorder.set_cpu_utilization(cpu)
            h.orca_recorder.set_qps(100)
            handles.append(h)
    finally:
        orca.configure(min_interval=1.0, per_call=True)
    return handles


@pytest.mark.parametrize("oob", [False, True], ids=["per-call", "oob"])
def test_grpc_go_wrr_over_waypost_servers(oob: bool) -> None:
    # OOB: the servers send no trailers at all, so the split can only come from the OOB streams
    handles = _serve_waypost(per_call=not oob)
    try:
        result = run_wrr_client([h.address for h in handles], wrr_config(oob=oob, blackout="1s"), 1800,
                                batch=600, interval=0.001, timeout=90)
    finally:
        for h in handles:
            h.stop(0)
    assert result["errors"] == 0, result
    _check(result["batches"][-1]["counts"], f"grpc-go wrr over waypost servers ({'oob' if oob else 'per call'})")


def _waypost_split(addresses: list[str], oob: bool) -> dict[str, int]:
    cfg = {"blackoutPeriod": "0.3s", "weightUpdatePeriod": "0.1s", "enableOobLoadReport": oob,
           "oobReportingPeriod": "0.2s"}
    with waypost.dial("direct:///" + ",".join(addresses),
                      service_config={"loadBalancingConfig": [{"weighted_round_robin": cfg}]}) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        req = echo_pb2.EchoRequest(message="x")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # until every backend has a weight (bounded)
            for _ in range(30):
                stub.Unary(req, timeout=10)
            if not oob or all(w > 0 for w in ch.balancer.policy.weights().values()):
                break
            time.sleep(0.1)
        time.sleep(0.3)
        return dict(collections.Counter(stub.Unary(req, timeout=10).server for _ in range(600)))


@pytest.mark.parametrize("oob", [False, True], ids=["per-call", "oob"])
def test_waypost_wrr_over_grpc_go_orca_servers(oob: bool) -> None:
    servers = []
    try:
        for name, cpu in LOADS.items():
            servers.append(start_orca_server(name, cpu=cpu, rps=100, oob=oob))
        counts = _waypost_split([s.address for s in servers], oob)
    finally:
        for s in servers:
            s.stop()
    if oob:
        _check(counts, "waypost wrr over grpc-go orca-servers (oob)")
    else:  # grpcio keeps endpoint-load-metrics-bin from Python: no weights, an even spread
        print(f"waypost wrr over grpc-go orca-servers (per call, no readable trailer): {counts}")
        assert sum(counts.values()) == 600 and all(abs(v - 200) <= 10 for v in counts.values()), counts
