"""The Registry contract: the same tests against the memory registry and a real etcd."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from harness.waiting import wait_until
from tests.etcd.helpers import next_batches, run
from waypost import _loop
from waypost.errors import Compacted, LeaseNotFound


def _put(reg, key, value, **kw):
    return reg.sync.put(key, value.encode() if isinstance(value, str) else value, **kw)


def test_put_get_revisions_and_versions(registry):
    s = registry.sync
    r0 = s.get("nothing").revision
    p1 = _put(registry, "a/1", "x")
    assert p1.revision == r0 + 1
    p2 = _put(registry, "a/1", "y", prev_kv=True)
    assert p2.revision == r0 + 2
    assert p2.prev_kv is not None and p2.prev_kv.value == b"x"
    g = s.get("a/1")
    assert g.revision == p2.revision
    (kv,) = g.kvs
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        "a/1", b"y", p1.revision, p2.revision, 2, 0,
    )
    # delete resets the version; a new put creates the key again
    s.delete("a/1")
    p3 = _put(registry, "a/1", "z")
    (kv,) = s.get("a/1").kvs
    assert (kv.create_revision, kv.version) == (p3.revision, 1)


def test_prefix_get_sorted_keys_only_count_and_limit(registry):
    s = registry.sync
    for k in ["svc/3", "svc/1", "svc/2", "svc0", "sv"]:
        _put(registry, k, "v-" + k)
    g = s.get("svc/", prefix=True)
    assert [kv.key for kv in g.kvs] == ["svc/1", "svc/2", "svc/3"]
    assert g.count == 3
    assert [kv.value for kv in s.get("svc/", prefix=True, keys_only=True).kvs] == [b"", b"", b""]
    c = s.get("svc/", prefix=True, count_only=True)
    assert (c.kvs, c.count) == ([], 3)
    lim = s.get("svc/", prefix=True, limit=2)
    assert [kv.key for kv in lim.kvs] == ["svc/1", "svc/2"] and lim.count == 3
    assert [kv.key for kv in s.get("svc", prefix=True).kvs] == ["svc/1", "svc/2", "svc/3", "svc0"]


def test_prefix_get_with_some_keys_leased_or_empty(registry):
    """A prefix where only some keys have a lease or a value, and a key that is not UTF-8: every field
    of every KeyValue and get_values() are right (etcd reads such records one message each)."""
    s = registry.sync
    lease = s.grant(60)
    rows = [("m/a", b"x", lease), ("m/b", b"", 0), ("m/c\udcff", b"z", 0), ("m/d", b"", lease)]
    revs = [_put(registry, k, v, lease=le).revision for k, v, le in rows]
    for prefix, want in (("m/", rows), ("m/a", rows[:1])):
        g = s.get(prefix, prefix=True)
        assert [(kv.key, kv.value, kv.lease, kv.create_revision, kv.mod_revision, kv.version) for kv in g.kvs] == [
            (k, v, le, r, r, 1) for (k, v, le), r in zip(want, revs)]
        vals = s.get_values(prefix, prefix=True)
        assert (vals.keys, vals.values, vals.mod_revisions) == (
            [k for k, _, _ in want], [v for _, v, _ in want], revs[:len(want)])
        assert vals.revision == g.revision
    assert [kv.value for kv in s.get("m/", prefix=True, keys_only=True).kvs] == [b""] * 4
    s.revoke(lease)
    assert [kv.key for kv in s.get("m/", prefix=True).kvs] == ["m/b", "m/c\udcff"]


def test_get_values_are_the_get_as_columns(registry, unique_key):
    s = registry.sync
    for name, value in (("b", b"2"), ("a", b"1"), ("c", b"3")):
        s.put(f"{unique_key}/{name}", value)
    s.put(f"{unique_key}/a", b"1bis")
    s.put(f"{unique_key}0", b"beside the prefix")
    res = s.get(unique_key + "/", prefix=True)
    vals = s.get_values(unique_key + "/", prefix=True)
    assert vals.keys == [f"{unique_key}/{n}" for n in "abc"]
    assert (vals.keys, vals.values, vals.mod_revisions) == (
        [kv.key for kv in res.kvs], [kv.value for kv in res.kvs], [kv.mod_revision for kv in res.kvs])
    assert vals.values == [b"1bis", b"2", b"3"] and vals.revision == res.revision
    one = s.get_values(unique_key + "/b")  # not a prefix: the key itself
    assert (one.keys, one.values) == ([unique_key + "/b"], [b"2"])
    none = s.get_values(unique_key + "/none/", prefix=True)
    assert (none.keys, none.values, none.mod_revisions, none.revision) == ([], [], [], res.revision)


def test_get_kvs_behave_like_a_list(registry, unique_key):
    """``GetResult.kvs`` (a lazy sequence with etcd) looks like the list of its KeyValues."""
    from waypost.discovery.store import GetResult, KeyValue

    s = registry.sync
    for name, value in (("b", b"2"), ("a", b"1"), ("c", b"3")):
        s.put(f"{unique_key}/{name}", value)
    res = s.get(unique_key + "/", prefix=True)
    kvs = res.kvs
    assert len(kvs) == 3 and bool(kvs)
    plain = list(kvs)
    assert [kv.key for kv in plain] == [f"{unique_key}/{n}" for n in "abc"]
    assert all(type(kv) is KeyValue for kv in plain)
    assert kvs == plain and plain == kvs
    assert kvs.__ne__(plain) is False
    assert kvs != [] and kvs != plain[:2] and kvs != tuple(plain)
    assert kvs[0] == plain[0] and kvs[-1] == plain[-1] and kvs[1:] == plain[1:]
    assert list(reversed(kvs)) == plain[::-1]
    assert plain[1] in kvs and kvs.index(plain[2]) == 2
    (a, b, c) = kvs
    assert (a.value, b.value, c.value) == (b"1", b"2", b"3")
    assert repr(kvs) == repr(plain)
    assert res == GetResult(plain, res.revision, res.count)

    empty = s.get(unique_key + "/none/", prefix=True)
    assert empty.kvs == [] and not empty.kvs and len(empty.kvs) == 0 and list(empty.kvs) == []
    counted = s.get(unique_key + "/", prefix=True, count_only=True)
    assert (counted.kvs, counted.count) == ([], 3)


def test_concurrent_first_access_converts_consistently(registry, unique_key):
    s = registry.sync
    for i in range(200):
        s.put(f"{unique_key}/{i:03d}", str(i).encode())
    for _ in range(5):
        res = s.get(unique_key + "/", prefix=True)
        seen: list[list[str]] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def read(res=res, seen=seen, errors=errors, barrier=barrier) -> None:
            try:
                barrier.wait(10)
                seen.append([kv.key for kv in res.kvs])
                assert len(res.kvs) == 200
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert len(seen) == 4 and all(keys == [f"{unique_key}/{i:03d}" for i in range(200)] for keys in seen)


def test_delete_prefix_is_one_revision(registry):
    s = registry.sync
    for i in range(4):
        _put(registry, f"d/{i}", str(i))
    before = s.get("d/", prefix=True).revision
    d = s.delete("d/", prefix=True, prev_kv=True)
    assert d.deleted == 4 and d.revision == before + 1
    assert sorted(kv.value for kv in d.prev_kvs) == [b"0", b"1", b"2", b"3"]
    assert s.get("d/", prefix=True).kvs == []
    # deleting nothing writes nothing
    again = s.delete("d/", prefix=True)
    assert again.deleted == 0 and again.revision == d.revision


def test_get_at_past_revision_and_compaction(registry):
    s = registry.sync
    r1 = _put(registry, "h/k", "one").revision
    r2 = _put(registry, "h/k", "two").revision
    _put(registry, "h/k", "three")
    assert s.get("h/k", revision=r1).kvs[0].value == b"one"
    assert s.get("h/k", revision=r2).kvs[0].value == b"two"
    s.compact(r2)
    with pytest.raises(Compacted) as e:
        s.get("h/k", revision=r1)
    assert e.value.compact_revision == r2
    assert s.get("h/k").kvs[0].value == b"three"


def test_watch_from_revision_sees_exactly_later_events(registry):
    s = registry.sync
    _put(registry, "w/a", "1")
    rb = _put(registry, "w/b", "2").revision
    _put(registry, "w/c", "3")
    _put(registry, "other", "x")
    watch = registry.watch("w/", prefix=True, start_revision=rb)
    try:
        batches = next_batches(watch, 2)
        assert [[(e.type, e.kv.key, e.kv.value) for e in b] for b in batches] == [
            [("put", "w/b", b"2")], [("put", "w/c", b"3")],
        ]
        d = s.delete("w/", prefix=True)
        (batch,) = next_batches(watch, 1)
        assert [(e.type, e.kv.key, e.kv.mod_revision) for e in batch] == [
            ("delete", "w/a", d.revision), ("delete", "w/b", d.revision), ("delete", "w/c", d.revision),
        ]
        assert watch.revision == d.revision
    finally:
        watch.cancel()


def test_watch_prev_kv(registry):
    r = _put(registry, "pv/k", "old").revision
    watch = registry.watch("pv/k", start_revision=r + 1, prev_kv=True)
    try:
        _put(registry, "pv/k", "new")
        (batch,) = next_batches(watch, 1)
        (ev,) = batch
        assert ev.kv.value == b"new" and ev.prev_kv is not None and ev.prev_kv.value == b"old"
    finally:
        watch.cancel()


def test_watch_from_compacted_revision_raises(registry):
    s = registry.sync
    r1 = _put(registry, "c/k", "1").revision
    _put(registry, "c/k", "2")
    r3 = _put(registry, "c/k", "3").revision
    s.compact(r3)
    watch = registry.watch("c/", prefix=True, start_revision=r1)

    async def first():
        return await asyncio.wait_for(watch.__anext__(), 10)

    try:
        with pytest.raises(Compacted) as e:
            run(first())
        assert e.value.compact_revision == r3
    finally:
        watch.cancel()


def test_cancelled_watch_stops_iteration(registry):
    watch = registry.watch("cx/", prefix=True)

    async def drain():
        return [b async for b in watch]

    fut = _loop.submit(drain())
    watch.cancel()
    assert fut.result(10) == []


def test_lease_expiry_deletes_keys_with_events(registry):
    s = registry.sync
    lease = s.grant(1)
    assert s.time_to_live(lease) >= 0
    r = _put(registry, "l/a", "1", lease=lease).revision
    _put(registry, "l/b", "2", lease=lease)
    assert s.get("l/a").kvs[0].lease == lease
    watch = registry.watch("l/", prefix=True, start_revision=r + 2)
    try:
        assert wait_until(lambda: s.get("l/", prefix=True).kvs == [], timeout=15)
        (batch,) = next_batches(watch, 1)
        assert sorted((e.type, e.kv.key) for e in batch) == [("delete", "l/a"), ("delete", "l/b")]
        assert s.time_to_live(lease) == -1
    finally:
        watch.cancel()


def test_put_with_unknown_lease_fails(registry):
    with pytest.raises(LeaseNotFound):
        _put(registry, "l/x", "1", lease=0x7777777)


def test_revoke_deletes_at_once_and_unknown_is_fine(registry):
    s = registry.sync
    lease = s.grant(30)
    _put(registry, "rv/a", "1", lease=lease)
    s.revoke(lease)
    assert s.get("rv/a").kvs == []
    assert s.time_to_live(lease) == -1
    s.revoke(lease)  # unknown now: not an error


def test_keep_alive_keeps_short_lease_and_reports_loss(registry):
    s = registry.sync
    lease = s.grant(1)
    _put(registry, "ka/a", "1", lease=lease)
    lost: list[tuple[int, BaseException | None]] = []
    got = threading.Event()

    def on_lost(lid, reason):
        lost.append((lid, reason))
        got.set()

    async def start():
        return registry.keep_alive(lease, 1, on_lost)

    ka = run(start())
    try:
        time.sleep(3.0)
        assert s.get("ka/a").kvs, "a kept-alive 1 s lease expired within 3 s"
        assert lost == []
        s.revoke(lease)
        assert got.wait(10), "on_lost not called after the lease was revoked"
        assert lost[0][0] == lease
    finally:
        ka.cancel()


def test_keep_alive_cancel_lets_lease_expire(registry):
    s = registry.sync
    lease = s.grant(1)
    _put(registry, "kc/a", "1", lease=lease)

    async def start():
        return registry.keep_alive(lease, 1, lambda *_: None)

    ka = run(start())
    ka.cancel()
    assert wait_until(lambda: s.get("kc/a").kvs == [], timeout=15)

