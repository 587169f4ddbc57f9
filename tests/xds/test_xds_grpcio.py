"""A stock grpcio client (a separate process importing only grpc and the Echo stubs) dials ``xds:///NAME`` through
``waypost xds serve`` over a real etcd: balancing, registrations coming and going, drained backends, zones as
priorities with failover, ring_hash on a header."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from harness.waiting import wait_until
from tests.xds.test_xds_support import Backends, StockClient, XdsServe, picks_all, stock_client

_ids = itertools.count()


@pytest.fixture(scope="module")
def setup(shared_etcd, tmp_path_factory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("xds")
    prefix = f"xds{os.getpid()}-{next(_ids)}"
    endpoint = shared_etcd.endpoint
    keys = {n: f"{prefix}-{n}.rpc" for n in ("bal", "drain", "zone", "hash", "wt")}
    opts = {"bal": "", "drain": "", "zone": " prefer=zone:a", "hash": " policy=ring_hash hash_header=x-user", "wt": ""}
    exports = [f"{n}=etcd:///{endpoint}?key={k}{opts[n]}" for n, k in keys.items()]
    serve = XdsServe(exports, log=tmp / "serve.log")
    try:
        with stock_client(serve.bootstrap(), tmp) as client:
            yield {"serve": serve, "client": client, "keys": keys, "registry": shared_etcd.url(), "tmp": tmp}
    finally:
        code = serve.terminate()
        serve.close()
    assert code == 0, f"xds serve exited with {code} on SIGTERM:\n{serve.log()[-3000:]}"


def _backends(setup: dict[str, Any], name: str) -> Backends:
    return Backends(setup["registry"], setup["keys"][name])


def test_balances_over_every_server_and_follows_registrations(setup) -> None:
    client: StockClient = setup["client"]
    b = _backends(setup, "bal")
    try:
        for n in ("a", "b", "c"):
            b.add(n)
        picks_all(client, "bal", {"a", "b", "c"}, n=30)
        got = client.calls("bal", 30)["servers"]  # a batch once all three are connected: round_robin's shares
        assert min(got.values()) >= 5, got
        client.start("bal", pause_ms=1)
        time.sleep(0.3)
        b.add("d")
        t_add = time.monotonic()
        time.sleep(1.0)
        t_remove = b.deregister("a")
        time.sleep(1.0)
        events = client.stop()
        errors = [e for e in events if e[1].startswith("!")]
        assert not errors, errors[:5]
        first_d = min(t for t, s in events if s == "d")
        last_a = max(t for t, s in events if s == "a")
        print(f"\nxds push -> picks (stock grpcio, etcd, {len(events)} calls): added endpoint first picked "
              f"{(first_d - t_add) * 1000:.1f} ms after its registration; removed endpoint last picked "
              f"{max(last_a - t_remove, 0) * 1000:.1f} ms after its deregistration")
        assert first_d - t_add < 5.0
        assert last_a - t_remove < 5.0
        assert {s for t, s in events if t > t_remove + 0.5} == {"b", "c", "d"}
    finally:
        b.close()


def test_drained_backend_gets_no_traffic(setup) -> None:
    client: StockClient = setup["client"]
    b = _backends(setup, "drain")
    try:
        b.add("x", weight=0)
        b.add("y")
        b.add("z", weight=200)
        got = picks_all(client, "drain", {"y", "z"}, n=40)
        assert "x" not in got
        assert client.calls("drain", 60)["servers"].get("x") is None
    finally:
        b.close()


def _shares(client: StockClient, name: str, calls: int) -> dict[str, float]:
    got = client.calls(name, calls)
    assert not got["errors"], got
    return {k: round(100.0 * v / calls, 1) for k, v in sorted(got["servers"].items())}


def test_registered_weights_split_round_robin_calls(setup) -> None:
    """Weights 10/30/60 in one zone split a round_robin client's calls 10/30/60 % (each weight is a sub-zone
    locality), and 80/20/0 split them 80/20 once re-registered."""
    client: StockClient = setup["client"]
    b = _backends(setup, "wt")
    try:
        for n, w in (("a", 10), ("b", 30), ("c", 60)):
            b.add(n, weight=w)
        picks_all(client, "wt", {"a", "b", "c"}, n=60)
        first = _shares(client, "wt", 2000)
        for n, w in (("a", 80), ("b", 20), ("c", 0)):
            b.pubs[n].update_metadata({"weight": w})
        picks_all(client, "wt", {"a", "b"}, n=60)
        second = _shares(client, "wt", 2000)
    finally:
        b.close()
    print(f"\nstock grpcio, registered weights: 10/30/60 -> {first}; 80/20/0 -> {second} (2000 calls each)")
    for got, want in ((first, {"a": 10, "b": 30, "c": 60}), (second, {"a": 80, "b": 20})):
        assert set(got) == set(want) and all(abs(got[k] - w) <= 5 for k, w in want.items()), (got, want)


def test_zone_preference_is_a_priority_with_failover(setup) -> None:
    client: StockClient = setup["client"]
    b = _backends(setup, "zone")
    try:
        a1 = b.add("a1", zone="a")
        b.add("b1", zone="b")
        b.add("b2", zone="b")
        wait_until(lambda: client.calls("zone", 20)["servers"] == {"a1": 20}, 20, "every call to zone a")
        a1.stop(0)  # zone a's only server dies (still registered): priority 1 takes over
        wait_until(lambda: set(client.calls("zone", 20)["servers"]) == {"b1", "b2"}, 20, "failover to zone b")
        got = client.calls("zone", 40)
        assert not got["errors"] and set(got["servers"]) == {"b1", "b2"}, got
    finally:
        b.close()


def test_ring_hash_keeps_a_header_key_on_one_backend(setup) -> None:
    client: StockClient = setup["client"]
    b = _backends(setup, "hash")
    try:
        for n in ("h1", "h2", "h3"):
            b.add(n)
        wait_until(lambda: len(client.calls("hash", 30)["servers"]) == 3, 20, "random hashes reach every server")
        owners = {}
        for user in range(8):
            got = client.calls("hash", 15, f"x-user=user{user}")
            assert not got["errors"] and len(got["servers"]) == 1, got
            owners[user] = next(iter(got["servers"]))
        assert len(set(owners.values())) >= 2, owners
    finally:
        b.close()
