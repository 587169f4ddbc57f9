"""An etcd that comes back with an older store (data directory emptied, or restored from a snapshot).

The watches of a client had reached revision ~60; the store that comes back is at a lower revision,
so resuming at 61 would wait silently for revisions it reaches only much later. The client must
notice, warn once, count it, and make subscribers and channels start over from the new store.
Real etcd processes, real gRPC servers, real SIGKILL.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.etcd.helpers import put_when_back
from waypost import metrics
from waypost.discovery import Subscriber
from waypost.etcd.local import EtcdNotFound, LocalEtcd, find_binary

Req = echo_pb2.EchoRequest


def _servers_seen(stub, n: int = 6) -> set[str]:
    return {stub.Unary(Req(), timeout=10).server for _ in range(n)}




def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "waypost.etcd.watch" and r.levelno == logging.WARNING and "back in time" in r.getMessage()]


def _resets(prom: CollectorRegistry) -> float:
    return prom.get_sample_value("waypost_registry_store_resets_total") or 0.0


def _follow_a_store_going_back(etcd: LocalEtcd, key: str, caplog, go_back) -> None:
    """Push the revision to ~60, register a and b, subscribe and dial, let ``go_back`` replace the
    store (it returns the addresses the new store holds), then register c: the view and the channel
    follow the new store within a bounded time, with one warning and one count."""
    caplog.set_level(logging.WARNING, logger="waypost.etcd.watch")
    prom = CollectorRegistry()
    metrics.enable(prom)
    reg = waypost.connect(etcd.url())
    try:
        with echo_servers("a", "b", "c") as (a, b, c):
            for i in range(56):
                reg.sync.put(f"{key}-bump", str(i))
            reg.sync.put(f"{key}/1", a.address)
            reg.sync.put(f"{key}/2", b.address)
            sub = Subscriber(reg, key)
            try:
                with waypost.dial(f"etcd:///{etcd.endpoint}?key={key}", balancer="round_robin") as ch:
                    stub = echo_pb2_grpc.EchoStub(ch)
                    assert sorted(sub.values()) == sorted([a.address, b.address])
                    wait_until(lambda: _servers_seen(stub) == {"a", "b"}, 20, what="both backends used")
                    held = go_back(reg, {"a": a.address, "b": b.address})
                    put_when_back(reg, f"{key}/3", c.address)
                    want = sorted([*held.values(), c.address])
                    wait_until(lambda: sorted(sub.values()) == want, 20, what=f"view {want}")
                    wait_until(lambda: _servers_seen(stub) == {*held, "c"}, 20, what="channel uses the new store")
                    assert len(_warnings(caplog)) == 1, _warnings(caplog)
                    assert _resets(prom) == 1
            finally:
                sub.close()
    finally:
        metrics.disable()


def test_subscriber_and_channel_follow_an_etcd_restarted_empty(etcd, unique_key, caplog):
    member = etcd.members[0]

    def wipe(reg, _addresses: dict[str, str]) -> dict[str, str]:
        member.kill()
        shutil.rmtree(member.data_dir)
        member.cluster_state = "new"  # an empty data directory bootstraps a new one-member cluster
        member.start()
        return {}  # nothing survived

    _follow_a_store_going_back(etcd, unique_key, caplog, wipe)


def test_subscriber_and_channel_follow_an_etcd_restored_from_a_snapshot(etcd, unique_key, caplog, tmp_path):
    try:
        etcdutl = find_binary("etcdutl")
    except EtcdNotFound as e:
        pytest.skip(f"snapshot restore needs etcdutl: {e}")
    member = etcd.members[0]
    snap = tmp_path / "backup.db"

    def restore(reg, addresses: dict[str, str]) -> dict[str, str]:
        etcd.etcdctl("snapshot", "save", str(snap))  # holds a and b
        reg.sync.delete(f"{unique_key}/2")  # after the backup: b goes, the revision moves on
        for i in range(20):
            reg.sync.put(f"{unique_key}-bump", f"late{i}")
        member.kill()
        shutil.rmtree(member.data_dir)
        peer = f"http://{member.host}:{member.peer_port}"
        subprocess.run([etcdutl, "snapshot", "restore", str(snap), "--data-dir", str(member.data_dir),
                        "--name", member.name, "--initial-cluster", f"{member.name}={peer}",
                        "--initial-cluster-token", "waypost-local", "--initial-advertise-peer-urls", peer],
                       check=True, capture_output=True, timeout=30)
        member.start()
        return addresses  # the backup still held a and b: b is back

    _follow_a_store_going_back(etcd, unique_key, caplog, restore)
