"""Which address serve() registers when the registry is on loopback (a node-local etcd proxy, a port-forward).

The interface case needs a host with a non-loopback interface, and tests use loopback only: it runs in a
network namespace of its own (``unshare -n``) holding a veth pair it creates, so the "interface address" is
one nothing outside the namespace can see. Inside: a real etcd on loopback, serve() on the wildcard, and a
client that dials what was registered.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer
from waypost.server import serve

ROOT = Path(__file__).resolve().parents[2]
NETNS_ADDRESS = "10.77.0.2"  # only ever inside the namespace the test makes

CHILD = textwrap.dedent("""
    import json, logging
    from concurrent import futures
    import grpc, waypost
    from harness.backends import echo_pb2, echo_pb2_grpc
    from harness.backends.server import EchoServicer
    from waypost.etcd.local import LocalEtcd

    logging.basicConfig(level=logging.WARNING)  # the parent reads the warnings on stderr
    with LocalEtcd(1) as etcd:
        server = grpc.server(futures.ThreadPoolExecutor(4))
        echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("netns"), server)
        with waypost.serve(server, "adv.rpc", registry=etcd.url(), grace=0) as handle:
            kvs = waypost.connect(etcd.url()).sync.get("adv.rpc/", prefix=True).kvs
            with waypost.dial(f"etcd:///{etcd.endpoint}?key=adv.rpc") as ch:
                answered = echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=20).server
            print(json.dumps({"address": handle.address, "port": handle.port,
                              "registered": [kv.value.decode() for kv in kvs], "answered": answered}))
""")


def _netns_usable() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    try:
        probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=20,
                               check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(not _netns_usable(), reason="needs `unshare -n` (root or user namespaces) and `ip`")


def _serve_in_netns(with_interface: bool) -> tuple[dict, str]:
    setup = "ip link set lo up"
    if with_interface:
        setup += (f" && ip link add wp0 type veth peer name wp1 && ip addr add {NETNS_ADDRESS}/24 dev wp0"
                  " && ip link set wp0 up && ip link set wp1 up")
    cmd = ["unshare", "-n", "sh", "-c", f'{setup} && exec "$0" -c "$1"', sys.executable, CHILD]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@needs_netns
def test_loopback_registry_advertises_the_interface_address():
    out, stderr = _serve_in_netns(with_interface=True)
    assert out["address"] == f"{NETNS_ADDRESS}:{out['port']}"
    assert out["registered"] == [out["address"]] and out["answered"] == "netns"
    assert "advertising the loopback address" not in stderr


@needs_netns
def test_no_interface_but_loopback_advertises_loopback_with_a_warning():
    out, stderr = _serve_in_netns(with_interface=False)
    assert out["address"] == f"127.0.0.1:{out['port']}"
    assert out["registered"] == [out["address"]] and out["answered"] == "netns"
    assert "WARNING" in stderr and "no network interface other than loopback" in stderr


def test_allow_loopback_advertises_loopback_for_a_loopback_registry_with_a_warning(shared_etcd, unique_key,
                                                                                  caplog):
    caplog.set_level(logging.WARNING, logger="waypost.netutil")
    server = grpc.server(futures.ThreadPoolExecutor(4))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("lo"), server)
    with serve(server, unique_key, registry=shared_etcd.url(), grace=0, allow_loopback=True) as h:
        assert h.address == f"127.0.0.1:{h.port}"
        kvs = waypost.connect(shared_etcd.url()).sync.get(unique_key + "/", prefix=True).kvs
        assert [kv.value for kv in kvs] == [h.address.encode()]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("allow_loopback=True" in m and "only clients on this host" in m for m in warned), warned
