"""The native path: ``waypost.xds.channel`` / ``aio_channel`` start an in-process control plane and return plain gRPC
channels on ``xds:///NAME`` (run in a child process: gRPC's xDS bootstrap is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from tests.xds.test_xds_support import ROOT, _env
from waypost.xds import XdsBootstrapConflict, local

SCRIPT = r'''
import asyncio, json, os, sys
import grpc
import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from tests.channel.support import echo_servers

out = {}
with echo_servers("p1", "p2", "p3") as servers:
    target = "direct:///" + ",".join(s.address for s in servers)
    ch = waypost.xds.channel("native", {"native": target})
    assert isinstance(ch, grpc.Channel) and type(ch).__module__.startswith("grpc")
    stub = echo_pb2_grpc.EchoStub(ch)
    got = [stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=10, wait_for_ready=True).server for _ in range(60)]
    out["sync"] = {n: got.count(n) for n in set(got)}
    out["bootstrap_set"] = "xds_servers" in os.environ.get("GRPC_XDS_BOOTSTRAP_CONFIG", "")

    async def aio_calls():
        ach = waypost.xds.aio_channel("hashed", ["hashed=" + target + " policy=ring_hash hash_header=x-k"])
        astub = echo_pb2_grpc.EchoStub(ach)
        owners = set()
        for _ in range(20):
            r = await astub.Unary(echo_pb2.EchoRequest(message="x"), timeout=10, metadata=[("x-k", "same")],
                                  wait_for_ready=True)
            owners.add(r.server)
        await ach.close()
        return sorted(owners)

    out["aio_owners"] = asyncio.run(aio_calls())
    try:
        waypost.xds.channel("missing")
    except waypost.WaypostError as e:
        out["missing"] = str(e)
    ch.close()
print(json.dumps(out), flush=True)
os._exit(0)
'''


def test_native_channels_balance_in_grpc(tmp_path) -> None:
    script = tmp_path / "native.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out["sync"]) == {"p1", "p2", "p3"} and min(out["sync"].values()) >= 10, out
    assert out["bootstrap_set"]
    assert len(out["aio_owners"]) == 1, out  # ring_hash on the header: one backend for one key
    assert "'missing' is not exported" in out["missing"] and "native" in out["missing"]


def test_another_bootstrap_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(local, "_local", None)
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", '{"xds_servers": [{"server_uri": "elsewhere:1"}]}')
    with pytest.raises(XdsBootstrapConflict, match="already has an xDS bootstrap.*one xDS client per process"):
        local.start_local({"g": "direct:///127.0.0.1:1"})
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG")
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", "/etc/some-bootstrap.json")
    with pytest.raises(XdsBootstrapConflict, match="GRPC_XDS_BOOTSTRAP is set"):
        local.start_local()
    assert local._local is None
