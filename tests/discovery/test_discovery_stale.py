"""Stale beats nothing: a subscriber started while etcd has no leader, or is down, gets a list anyway
(a serializable read of a surviving member, or the on-disk cache), marked stale, and follows the live
store once it answers. Real etcd processes and real gRPC backends."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.etcd.helpers import make_registry, run
from waypost.discovery import Subscriber, cache
from waypost.errors import RegistryUnavailable

Req = echo_pb2.EchoRequest


def _stale_gauge(collector, key: str) -> float | None:
    return collector.get_sample_value("waypost_discovery_stale", {"key": key})


@pytest.fixture
def prom():
    prometheus_client = pytest.importorskip("prometheus_client")
    import waypost.metrics

    reg = prometheus_client.CollectorRegistry()
    waypost.metrics.enable(registry=reg)
    try:
        yield reg
    finally:
        waypost.metrics.disable()


class _Views:
    """Every list a subscriber showed, recorded by a change listener."""

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.lock = threading.Lock()
        self.seen: list[set[str]] = []
        sub.add_listener(self._changed)

    def _changed(self) -> None:
        with self.lock:
            self.seen.append(set(self.sub.values()))


def test_no_leader_at_start_serves_the_survivors_list_stale_then_follows(etcd_cluster, prom, caplog):
    cluster = etcd_cluster
    writer = make_registry(cluster.endpoints)
    reg = make_registry(cluster.endpoints)
    sub = None
    try:
        writer.sync.put("nl.rpc/1", b"127.0.0.1:7301")
        writer.sync.put("nl.rpc/2", b"127.0.0.1:7302")
        # every member has applied both puts before two of them stop
        for m in cluster.members:
            member = make_registry(m.endpoint)
            try:
                wait_until(lambda member=member: len(run(member.get_values_stale("nl.rpc/", prefix=True)).keys) == 2,
                           10, "every member has both records")
            finally:
                run(member.close(), 15)
        survivor = cluster.members[0]
        for m in cluster.members[1:]:
            m.stop()
        caplog.set_level(logging.INFO, logger="waypost.discovery")
        t0 = time.monotonic()
        sub = Subscriber(reg, "nl.rpc", timeout=8)
        took = time.monotonic() - t0
        assert sorted(sub.values()) == ["127.0.0.1:7301", "127.0.0.1:7302"]
        assert sub.stale
        assert took < 6, took
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "possibly stale" in r.message]
        assert len(warnings) == 1 and "serializable read" in warnings[0].message, caplog.text
        assert _stale_gauge(prom, "nl.rpc/") == 1
        views = _Views(sub)
        assert survivor.running
        for m in cluster.members[1:]:
            m.start()
        wait_until(lambda: not sub.stale, 30, "the live read replaced the stale list")
        assert _stale_gauge(prom, "nl.rpc/") == 0
        assert any("up to date again" in r.message for r in caplog.records), caplog.text
        # the watch follows the store from the live read on
        writer.sync.put("nl.rpc/3", b"127.0.0.1:7303")
        writer.sync.delete("nl.rpc/1")
        wait_until(lambda: sorted(sub.values()) == ["127.0.0.1:7302", "127.0.0.1:7303"], 30)
        # reconciled by a diff: 7302 (registered all along) never left the list
        with views.lock:
            assert views.seen and all("127.0.0.1:7302" in s for s in views.seen), views.seen
    finally:
        if sub is not None:
            sub.close()
        run(reg.close(), 15)
        run(writer.close(), 15)


def test_etcd_down_at_start_dial_uses_the_cache_file_then_reconciles(etcd, tmp_path, caplog):
    path = str(tmp_path / "greet.cache.json")
    reg = make_registry(etcd.endpoint)
    with echo_servers("a", "b", "c") as (a, b, c):
        try:
            reg.sync.put("cf.rpc/a", a.address.encode())
            reg.sync.put("cf.rpc/b", b.address.encode())
            with Subscriber(reg, "cf.rpc", cache_file=path) as first:
                assert not first.stale
            doc = json.loads(Path(path).read_bytes())
            assert doc["key"] == "cf.rpc" and doc["version"] == cache.VERSION
            assert sorted(r[0] for r in doc["sources"]["cf.rpc/"]["records"]) == ["cf.rpc/a", "cf.rpc/b"]

            etcd.members[0].stop()
            caplog.set_level(logging.INFO, logger="waypost.discovery")
            target = f"etcd:///{etcd.endpoint}?key=cf.rpc&cache={path}"
            with waypost.dial(target, balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                seen = {stub.Unary(Req(), timeout=10).server for _ in range(8)}
                assert seen == {"a", "b"}
                assert any("possibly stale" in r.message and "cache file" in r.message for r in caplog.records)
                with Subscriber(etcd.url(), "cf.rpc", cache_file=path, timeout=8) as sub:
                    assert sub.stale and sorted(sub.values()) == sorted([a.address, b.address])
                    etcd.members[0].start()
                    wait_until(lambda: not sub.stale, 30, "the live read replaced the cached list")
                    reg.sync.put("cf.rpc/c", c.address.encode())
                    reg.sync.delete("cf.rpc/a")
                    wait_until(lambda: sorted(sub.values()) == sorted([b.address, c.address]), 30)
                wait_until(lambda: {stub.Unary(Req(), timeout=10).server for _ in range(8)} == {"b", "c"}, 30,
                           "the channel follows the live store")
            # the cache now holds the live list (written after the changes, and at close)
            got = cache.read(path, "cf.rpc", False, "gozero", ["cf.rpc/"])
            assert got.sources["cf.rpc/"].keys == ["cf.rpc/b", "cf.rpc/c"]
        finally:
            run(reg.close(), 15)


def test_async_open_uses_the_cache_file_while_etcd_is_down(etcd, tmp_path):
    import asyncio

    path = str(tmp_path / "aio.json")
    reg = make_registry(etcd.endpoint)
    try:
        reg.sync.put("ao.rpc/1", b"127.0.0.1:7501")
        Subscriber(reg, "ao.rpc", cache_file=path).close()
    finally:
        run(reg.close(), 15)
    etcd.members[0].stop()

    async def main() -> tuple[list[str], bool]:
        sub = await Subscriber.open(etcd.url(), "ao.rpc", cache_file=path, timeout=8)
        try:
            return sub.values(), sub.stale
        finally:
            await sub.aclose()

    assert asyncio.run(main()) == (["127.0.0.1:7501"], True)


@pytest.mark.parametrize("content", [b"{not json", b'{"waypost": "discovery-cache", "version": 99}',
                                     b"foreign"])
def test_a_corrupt_or_foreign_cache_file_is_ignored_with_a_warning(etcd, tmp_path, caplog, content):
    path = tmp_path / "c.json"
    if content == b"foreign":
        content = cache.encode("other.rpc", False, "gozero", etcd.url(), [("other.rpc/", 5, {"other.rpc/1": (b"x:1", 4)})])
    path.write_bytes(content)
    etcd.members[0].stop()
    caplog.set_level(logging.WARNING, logger="waypost.discovery")
    with pytest.raises(RegistryUnavailable):
        Subscriber(etcd.url(), "cc.rpc", cache_file=str(path), timeout=4)
    assert any("ignoring the discovery cache file" in r.message for r in caplog.records), caplog.text
    assert path.read_bytes() == content  # left as it was


def test_a_live_read_is_preferred_and_a_stale_list_is_never_written(etcd, tmp_path):
    path = tmp_path / "live.json"
    path.write_bytes(cache.encode("lv.rpc", False, "gozero", etcd.url(), [("lv.rpc/", 3, {"lv.rpc/old": (b"10.9.9.9:1", 2)})]))
    reg = make_registry(etcd.endpoint)
    try:
        reg.sync.put("lv.rpc/new", b"127.0.0.1:7401")
        with Subscriber(reg, "lv.rpc", cache_file=str(path)) as sub:
            assert sub.values() == ["127.0.0.1:7401"] and not sub.stale
        got = cache.read(str(path), "lv.rpc", False, "gozero", ["lv.rpc/"])
        assert got.sources["lv.rpc/"].keys == ["lv.rpc/new"]
    finally:
        run(reg.close(), 15)


# -- the cache file on its own ---------------------------------------------------------------------------


def test_cache_round_trip_keeps_raw_records_and_checks_the_subscription():
    raw = {"k.rpc/2": (b"\x00\xffbin", 7), "k.rpc/1": (b"127.0.0.1:1", 5)}
    data = cache.encode("k.rpc", False, "gozero", "etcd://u:secret@h:2379", [("k.rpc/", 9, raw)], written=123.0)
    assert b"secret" not in data
    got = cache.parse(data, "k.rpc", False, "gozero", ["k.rpc/", "_waypost/meta/k.rpc/"])
    cols = got.sources["k.rpc/"]
    assert (cols.keys, cols.values, cols.mod_revisions, cols.revision) == (
        ["k.rpc/1", "k.rpc/2"], [b"127.0.0.1:1", b"\x00\xffbin"], [5, 7], 9)
    assert got.sources["_waypost/meta/k.rpc/"].keys == [] and got.written == 123.0
    for key, exact, fmt in (("other", False, "gozero"), ("k.rpc", True, "gozero"), ("k.rpc", False, "kratos")):
        with pytest.raises(cache.CacheError, match="another subscription"):
            cache.parse(data, key, exact, fmt, ["k.rpc/"])
    bad = json.loads(data)
    bad["sources"]["k.rpc/"]["records"].append(["elsewhere/1", "", 1])
    with pytest.raises(cache.CacheError, match="outside the range"):
        cache.parse(json.dumps(bad).encode(), "k.rpc", False, "gozero", ["k.rpc/"])


def test_cache_writer_is_rate_limited_and_writes_at_close(tmp_path):
    path = str(tmp_path / "w.json")
    now = [100.0]
    n = [0]

    def snapshot() -> bytes:
        n[0] += 1
        return b"v%d" % n[0]

    async def go() -> tuple[int, bytes, int, bytes]:
        w = cache.CacheWriter(path, snapshot, clock=lambda: now[0])
        w.changed()  # the first write is at once
        first = w.writes, Path(path).read_bytes()
        for _ in range(5):
            now[0] += 0.1
            w.changed()  # within the second: deferred to one timer
        w.close()  # ...which close does now
        return (*first, w.writes, Path(path).read_bytes())

    assert run(go()) == (1, b"v1", 2, b"v2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json"]  # no temporary file left


def test_cache_target_option():
    from waypost import InvalidTarget
    from waypost.resolver.target import parse_target

    t = parse_target("etcd:///127.0.0.1:2379?key=a.rpc&cache=%2Fvar%2Fcache%2Fa.json")
    assert t.cache_file == "/var/cache/a.json" and "cache" not in t.registry_url()
    assert parse_target("etcd:///127.0.0.1:2379?key=a.rpc").cache_file is None
    with pytest.raises(InvalidTarget, match="empty cache="):
        parse_target("etcd:///127.0.0.1:2379?key=a.rpc&cache=")
    with pytest.raises(InvalidTarget, match="did you mean 'cache'"):
        parse_target("etcd:///127.0.0.1:2379?key=a.rpc&cach=x")
