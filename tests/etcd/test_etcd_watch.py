"""Watches on waypost's etcd client: one multiplexed stream, revisions, cancel, compaction."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harness.waiting import wait_until
from tests.etcd.helpers import collect_events, next_batch, registry
from waypost.errors import Compacted
from waypost.etcd.local import LocalEtcd


def test_many_watchers_share_one_stream_and_get_only_their_events(shared_etcd, unique_key):
    with registry(shared_etcd.endpoint) as reg:
        watches = [reg.watch(f"{unique_key}/{i}/", prefix=True) for i in range(12)]
        try:
            assert wait_until(lambda: all(w.connected for w in watches), 15)
            for i in reversed(range(12)):
                reg.sync.put(f"{unique_key}/{i}/k", str(i).encode())
            for i, w in enumerate(watches):
                (ev,) = next_batch(w)
                assert (ev.type, ev.kv.key, ev.kv.value) == ("put", f"{unique_key}/{i}/k", str(i).encode())
            assert reg.client.watches.connects == 1
        finally:
            for w in watches:
                w.cancel()


def test_watch_from_now_then_revision_property(shared_etcd, unique_key):
    k = unique_key + "/k"
    with registry(shared_etcd.endpoint) as reg:
        reg.sync.put(k, b"before")
        w = reg.watch(k)
        try:
            assert wait_until(lambda: w.connected, 15)
            created_at = w.revision
            assert created_at >= reg.sync.get(k).kvs[0].mod_revision
            r = reg.sync.put(k, b"after").revision
            (ev,) = next_batch(w)
            assert ev.kv.value == b"after" and w.revision == r
        finally:
            w.cancel()


def test_one_batch_per_revision(shared_etcd, unique_key):
    p = unique_key + "/"
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        start = s.put(p + "a", b"1").revision
        s.put(p + "b", b"2")
        d = s.delete(p, prefix=True)
        w = reg.watch(p, prefix=True, start_revision=start)
        try:
            b1, b2, b3 = (next_batch(w) for _ in range(3))
            assert [(e.type, e.kv.key) for e in b1] == [("put", p + "a")]
            assert [(e.type, e.kv.key) for e in b2] == [("put", p + "b")]
            assert [(e.type, e.kv.key, e.kv.mod_revision) for e in b3] == [
                ("delete", p + "a", d.revision), ("delete", p + "b", d.revision)]
        finally:
            w.cancel()


def test_cancel_from_another_thread_ends_iteration_and_stream_keeps_serving(shared_etcd, unique_key):
    with registry(shared_etcd.endpoint) as reg:
        a = reg.watch(unique_key + "/a/", prefix=True)
        b = reg.watch(unique_key + "/b/", prefix=True)
        try:
            assert wait_until(lambda: a.connected and b.connected, 15)

            async def drain():
                return [batch async for batch in a]

            fut = asyncio.run_coroutine_threadsafe(drain(), __import__("waypost._loop")._loop.get_loop())
            threading.Thread(target=a.cancel).start()
            assert fut.result(10) == []
            reg.sync.put(unique_key + "/a/x", b"1")
            reg.sync.put(unique_key + "/b/x", b"2")
            (ev,) = next_batch(b)
            assert ev.kv.key == unique_key + "/b/x"
            assert a.watch_id is None
        finally:
            b.cancel()


def test_watch_from_compacted_revision_raises_compacted(etcd):
    with registry(etcd.endpoint) as reg:
        s = reg.sync
        r1 = s.put("c/k", b"1").revision
        s.put("c/k", b"2")
        r3 = s.put("c/k", b"3").revision
        etcd.compact(r3)
        w = reg.watch("c/", prefix=True, start_revision=r1)
        with pytest.raises(Compacted) as e:
            next_batch(w)
        assert e.value.compact_revision == r3
        # the iteration stays ended
        with pytest.raises(StopAsyncIteration):
            next_batch(w)
        # other watchers on the same client are unaffected
        w2 = reg.watch("c/", prefix=True, start_revision=r3)
        try:
            (ev,) = next_batch(w2)
            assert ev.kv.value == b"3"
        finally:
            w2.cancel()


def test_progress_notify_advances_resume_revision(tmp_path):
    node = LocalEtcd(1, base_dir=tmp_path / "etcd",
                     extra_args=["--experimental-watch-progress-notify-interval=200ms"]).start()
    try:
        with registry(node.endpoint) as reg:
            w = reg.watch("quiet/", prefix=True, progress_notify=True)
            try:
                assert wait_until(lambda: w.connected, 15)
                r = reg.sync.put("elsewhere", b"x").revision
                # no event for the watcher, but progress notifications move its resume point
                assert wait_until(lambda: w.next_rev > r, 15)
                reg.sync.put("quiet/k", b"1")
                assert [e.kv.key for e in collect_events(w, 1)] == ["quiet/k"]
            finally:
                w.cancel()
    finally:
        node.close()


def test_delivery_groups_by_revision_and_drops_repeats():
    from waypost.etcd._generated import waypost_etcd_pb2 as pb
    from waypost.etcd.watch import Watcher

    def ev(key: str, rev: int) -> pb.Event:
        return pb.Event(type=pb.Event.PUT, kv=pb.KeyValue(key=key.encode(), mod_revision=rev))

    w = Watcher(None, b"k", b"", 5, False, False, lambda e: (e.kv.key.decode(), e.kv.mod_revision))  # type: ignore[arg-type]
    w._deliver([ev("a", 3), ev("b", 5), ev("c", 5), ev("d", 6)])  # 3 is before the start revision
    w._deliver([ev("e", 6), ev("f", 7)])  # the same revision continued in the next response
    w._deliver([ev("b", 5)])  # a repeat of an older revision
    assert list(w._queue) == [
        (5, [("b", 5), ("c", 5)]), (6, [("d", 6), ("e", 6)]), (7, [("f", 7)]),
    ]
    assert w.next_rev == 8
