"""A stock grpcio client (a separate process: grpc and the Echo stubs only) under xDS with gRPC's
``client_side_weighted_round_robin`` over three ``waypost.serve`` servers whose ORCA reports say CPU 0.9/0.3/0.1 at
100 requests/s: C-core weighs them as gRFC A58 says (weight = qps / utilization: 46/138/415 of 600), from the
per-call trailers and from the out-of-band stream."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from tests.xds.test_xds_support import XdsServe, stock_client
from waypost import orca

UTILS = {"w0": 0.9, "w1": 0.3, "w2": 0.1}
EXPECTED = {"w0": 46, "w1": 138, "w2": 415}


@pytest.fixture
def reporting_servers(shared_etcd, unique_key) -> Iterator[tuple[str, list[Any]]]:
    """Three servers registered under one key, each reporting its CPU utilization and 100 requests/s."""
    orca.configure(min_interval=0.05)  # the OOB variant asks for reports every 0.1 s
    handles = []
    try:
        for name, util in UTILS.items():
            server = grpc.server(futures.ThreadPoolExecutor(8))
            echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
            h = waypost.serve(server, unique_key, listen_on="127.0.0.1:0", registry=shared_etcd.url(), grace=0)
            h.orca_recorder.set_cpu_utilization(util)
            h.orca_recorder.set_qps(100)
            handles.append(h)
        yield unique_key, handles
    finally:
        for h in handles:
            h.stop(0)
        orca.configure(min_interval=1.0)


@pytest.mark.parametrize("oob", [False, True], ids=["per_call", "oob"])
def test_grpcio_weighs_waypost_servers_by_their_orca_reports(reporting_servers, shared_etcd, tmp_path, oob) -> None:
    key, handles = reporting_servers
    policy_config = {"blackoutPeriod": "0.3s", "weightUpdatePeriod": "0.1s", "enableOobLoadReport": oob,
                     "oobReportingPeriod": "0.1s"}
    config = tmp_path / "xds.json"
    config.write_text(json.dumps({"exports": {"wrr": {
        "target": f"etcd:///{shared_etcd.endpoint}?key={key}",
        "policy": "client_side_weighted_round_robin", "policy_config": policy_config}}}))
    serve = XdsServe([], extra=("--config", str(config)), log=tmp_path / f"serve-{os.getpid()}.log")
    try:
        with stock_client(serve.bootstrap(), tmp_path) as client:
            wait_until(lambda: len(client.calls("wrr", 30)["servers"]) == 3, 20, "calls reach the three servers")

            def settled() -> dict[str, Any] | None:  # the weights count once the blackout is over (bounded)
                got = client.calls("wrr", 600)
                counts = got["servers"]
                ok = not got["errors"] and all(abs(counts.get(n, 0) - e) <= max(15, e * 0.15)
                                               for n, e in EXPECTED.items())
                return got if ok else None

            got = wait_until(settled, 30, "the split follows the ORCA reports")
            # out of band: C-core holds one StreamCoreMetrics stream open to each server (and then ignores trailers)
            streams = [h.server._state.interceptor_pipeline.interceptors[0].oob.open_streams for h in handles]
            assert streams == ([1, 1, 1] if oob else [0, 0, 0])
            print(f"grpcio under xDS, client_side_weighted_round_robin {'OOB' if oob else 'per call'} over waypost "
                  f"servers reporting cpu 0.9/0.3/0.1: {got['servers']} of 600 (A58: 46/138/415)")
    finally:
        serve.terminate()
        serve.close()


def _example_rounds(*flags: str) -> list[dict[str, int]]:
    """examples/orca_wrr.py run as a reader runs it: the split of each round of 600 calls."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(root / "examples" / "orca_wrr.py"), "--rounds", "6", *flags],
                         capture_output=True, text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = []
    for line in out.stdout.splitlines():
        words = line.split(":", 1)[1].split()
        rounds.append({words[i]: int(words[i + 1]) for i in range(0, len(words), 2)})
    assert len(rounds) == 6, out.stdout
    return rounds


def test_example_utilization_that_follows_load_settles_as_a58_says() -> None:
    """docs/load-reports.md's example: application_utilization = busy time per second (service times 9/3/1 ms),
    so weight = qps / utilization = 1 / service time and 600 calls settle near 46/138/415."""
    rounds = _example_rounds()
    print(f"\norca_wrr.py, utilization follows load: {rounds}")
    last = rounds[-1]
    for name, expected in {"hot": 46, "warm": 138, "cool": 415}.items():
        assert abs(last[name] - expected) <= max(0.25 * expected, 20), rounds


def test_example_fixed_utilization_runs_away() -> None:
    """The same with constant reports 0.9/0.3/0.1 (rates measured): weight = qps / constant rewards the backend
    that already has the traffic, and the split drifts far past A58's 415 towards the 0.1 server."""
    rounds = _example_rounds("--fixed")
    print(f"\norca_wrr.py --fixed: {rounds}")
    assert rounds[-1]["cool"] >= 500 and rounds[-1]["cool"] > rounds[0]["cool"], rounds
