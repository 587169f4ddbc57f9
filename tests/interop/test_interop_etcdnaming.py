"""Interop with grpc-go's etcd naming (go.etcd.io/etcd/client/v3/naming): case 5.

``endpoints.Manager`` registrations are discovered by waypost (``format=etcd-naming``), and waypost
registrations in that format are resolved by grpc-go's ``etcd:///`` resolver.
"""

from __future__ import annotations

import base64
import collections
import json

import pytest

import waypost
from harness.waiting import wait_until
from tests.interop.support import (  # noqa: F401  (fixture_*: pytest fixtures go_bins, go_peers)
    call_counts,
    fixture_go_bins,
    fixture_go_peers,
    py_backends,
    timeout_mark,
)
from waypost.etcd.local import free_port

pytestmark = [pytest.mark.interop, timeout_mark()]

SETTLE = 30.0


def _raw(etcd, prefix: str) -> dict[str, bytes]:
    out = json.loads(etcd.etcdctl("get", prefix, "--prefix", "-w", "json"))
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]) for kv in out.get("kvs", [])}


def test_waypost_discovers_endpoints_manager(go_peers, shared_etcd, unique_key):
    servers = {}
    for _ in range(2):
        addr = f"127.0.0.1:{free_port()}"
        p = go_peers.start("etcdnaming", "-mode", "serve", "-etcd", shared_etcd.endpoint,
                           "-target", unique_key,
                           "-listen", addr)
        p.expect(lambda d: d.get("event") == "ready", SETTLE, "ready")
        servers[addr] = p

    # the Go side's bytes are the ones waypost writes for this format
    raw = _raw(shared_etcd, unique_key + "/")
    assert raw == {f"{unique_key}/{a}": json.dumps({"Op": 0, "Addr": a, "Metadata": None},
                                                    separators=(",", ":")).encode() for a in servers}
    sub = waypost.Subscriber(shared_etcd.url(), unique_key, format="etcd-naming")
    try:
        assert sorted(sub.values()) == sorted(servers)
    finally:
        sub.close()

    channel = waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}&format=etcd-naming",
                           balancer="round_robin")
    try:
        a, b = sorted(servers)
        seen: collections.Counter[str] = collections.Counter()
        wait_until(lambda: (seen.update(call_counts(channel, 20)), set(seen) >= {a, b})[1], SETTLE,
                   "answers from both grpc-go naming backends")
        assert set(seen) == {a, b}, seen
        assert call_counts(channel, 40) == {a: 20, b: 20}
        # DeleteEndpoint on SIGTERM: waypost drops the address
        servers[a].stop()
        wait_until(lambda: call_counts(channel, 10) == {b: 10}, SETTLE, "traffic moved to the survivor")
    finally:
        channel.close()


def test_waypost_reads_endpoint_metadata(go_peers, shared_etcd, unique_key):
    """grpc-go's resolver drops an endpoint's Metadata; waypost carries it to its backends."""
    addr = f"127.0.0.1:{free_port()}"
    meta = {"weight": 20, "zone": "z1"}
    p = go_peers.start("etcdnaming", "-mode", "serve", "-etcd", shared_etcd.endpoint, "-target", unique_key,
                       "-listen", addr, "-meta", json.dumps(meta))
    p.expect(lambda d: d.get("event") == "ready", SETTLE, "ready")
    assert _raw(shared_etcd, unique_key + "/") == {
        f"{unique_key}/{addr}": json.dumps({"Op": 0, "Addr": addr, "Metadata": meta}, separators=(",", ":")).encode()
    }
    sub = waypost.Subscriber(shared_etcd.url(), unique_key, format="etcd-naming")
    try:
        assert [(b.address, dict(b.metadata)) for b in sub.backends()] == [(addr, meta)]
    finally:
        sub.close()


@pytest.mark.parametrize("metadata", [None, {"weight": 20, "zone": "z1"}], ids=["no-metadata", "metadata"])
def test_grpc_go_resolver_resolves_waypost(go_peers, shared_etcd, unique_key, metadata):
    """With metadata the value's ``Metadata`` is a JSON object (grpc-go's field is ``any``): still resolved."""
    with py_backends(["py-a", "py-b"], unique_key, shared_etcd.url(), format="etcd-naming",
                     metadata=metadata) as handles:
        raw = _raw(shared_etcd, unique_key + "/")
        assert raw == {f"{unique_key}/{h.address}": json.dumps({"Op": 0, "Addr": h.address, "Metadata": metadata},
                                                                separators=(",", ":")).encode()
                       for h in handles.values()}
        client = go_peers.start("etcdnaming", "-mode", "call", "-etcd", shared_etcd.endpoint,
                                "-target", unique_key)
        client.expect(lambda d: d.get("event") == "ready", SETTLE, "ready")
        seen: collections.Counter[str] = collections.Counter()

        def both() -> bool:
            seen.update(client.request("call 20", "counts", SETTLE))
            return {"py-a", "py-b"} <= set(seen)

        wait_until(both, SETTLE, "grpc-go resolver reaches both Python backends")
        assert client.request("call 40", "counts", SETTLE) == {"py-a": 20, "py-b": 20}
        handles["py-a"].stop(1.0)
        wait_until(lambda: client.request("call 10", "counts", SETTLE) == {"py-b": 10}, SETTLE,
                   "grpc-go moved to py-b")
        assert client.request("call 30", "counts", SETTLE) == {"py-b": 30}
