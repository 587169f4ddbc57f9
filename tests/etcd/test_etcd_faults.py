"""Faults against real etcd processes: restarts, partitions, compaction, SIGSTOP, member loss, leases."""

from __future__ import annotations

import threading
import time

import pytest

from harness.tcp_proxy import TcpProxy
from harness.waiting import wait_until
from tests.etcd.helpers import collect_events, next_batch, on_loop, registry
from waypost.errors import Compacted, LeaseNotFound, RegistryUnavailable


class LostRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, BaseException | None]] = []
        self.event = threading.Event()

    def __call__(self, lease_id: int, reason: BaseException | None) -> None:
        self.calls.append((lease_id, reason))
        self.event.set()


def test_watch_survives_etcd_restart_exactly_once(etcd):
    with registry(etcd.endpoint) as reg:
        s = reg.sync
        w = reg.watch("svc/", prefix=True)
        try:
            assert wait_until(lambda: w.connected, 15)
            s.put("svc/a", b"1")
            s.put("svc/b", b"2")
            assert [e.kv.key for e in collect_events(w, 2)] == ["svc/a", "svc/b"]
            etcd.members[0].restart()
            r_c = s.put("svc/c", b"3").revision
            s.delete("svc/a")
            events = collect_events(w, 2, timeout=20)
            assert [(e.type, e.kv.key) for e in events] == [("put", "svc/c"), ("delete", "svc/a")]
            assert events[0].kv.mod_revision == r_c
            assert reg.client.watches.connects >= 2
            # nothing else (no duplicate of a/b/c) is pending
            s.put("svc/d", b"4")
            assert [e.kv.key for e in next_batch(w)] == ["svc/d"]
        finally:
            w.cancel()


def test_watch_resumes_after_partition_without_missing_or_repeating(etcd):
    proxy = TcpProxy(("127.0.0.1", etcd.members[0].client_port))
    try:
        with registry(proxy.endpoint, dial_timeout=1.0) as reg:
            w = reg.watch("p/", prefix=True)
            try:
                assert wait_until(lambda: w.connected, 15)
                etcd.etcdctl("put", "p/1", "a")
                assert [e.kv.key for e in collect_events(w, 1)] == ["p/1"]
                proxy.cut()
                assert wait_until(lambda: not w.connected, 15)
                for i in range(2, 6):  # written while the client is cut off
                    etcd.etcdctl("put", f"p/{i}", "x")
                proxy.restore()
                events = collect_events(w, 4, timeout=20)
                assert [e.kv.key for e in events] == ["p/2", "p/3", "p/4", "p/5"]
                etcd.etcdctl("put", "p/6", "x")
                assert [e.kv.key for e in next_batch(w)] == ["p/6"]
            finally:
                w.cancel()
    finally:
        proxy.close()


def test_compaction_past_a_disconnected_watcher_raises_compacted(etcd):
    proxy = TcpProxy(("127.0.0.1", etcd.members[0].client_port))
    try:
        with registry(proxy.endpoint, dial_timeout=1.0) as reg:
            w = reg.watch("cp/", prefix=True)
            try:
                assert wait_until(lambda: w.connected, 15)
                proxy.cut()
                assert wait_until(lambda: not w.connected, 15)
                etcd.etcdctl("put", "cp/1", "a")
                etcd.etcdctl("put", "cp/2", "b")
                rev = etcd.compact()
                proxy.restore()
                with pytest.raises(Compacted) as e:
                    collect_events(w, 1, timeout=20)
                assert e.value.compact_revision == rev
            finally:
                w.cancel()
    finally:
        proxy.close()


def test_sigstopped_etcd_is_detected_within_10s(etcd):
    with registry(etcd.endpoint, request_timeout=4.0) as reg:
        s = reg.sync
        w = reg.watch("frozen/", prefix=True)
        lease = s.grant(30)
        ka = on_loop(lambda: reg.keep_alive(lease, 30, lambda *_: None))
        try:
            assert wait_until(lambda: w.connected and reg.client.leases.connected, 15)
            etcd.members[0].pause()
            try:
                t0 = time.monotonic()
                with pytest.raises(RegistryUnavailable):
                    s.get("frozen/x")
                assert time.monotonic() - t0 < 10
                # the watch stream notices the frozen peer on its own (gRPC keepalive)
                assert wait_until(lambda: not w.connected, 10 - (time.monotonic() - t0) + 2)
                assert time.monotonic() - t0 < 12
            finally:
                etcd.members[0].resume()
            r = s.put("frozen/after", b"1").revision
            (ev,) = next_batch(w, 20)
            assert ev.kv.mod_revision == r
        finally:
            ka.cancel()
            w.cancel()


def test_cluster_member_stop_keeps_kv_keepalive_and_watch_going(etcd_cluster):
    with registry(etcd_cluster.endpoints) as reg:
        s = reg.sync
        s.put("cl/0", b"0")
        lease = s.grant(3)
        lost = LostRecorder()
        ka = on_loop(lambda: reg.keep_alive(lease, 3, lost))
        w = reg.watch("cl/", prefix=True)
        try:
            assert wait_until(lambda: w.connected and reg.client.leases.connected, 15)
            used = reg.client.pool.endpoints[reg.client.pool._current].address
            member = next(m for m in etcd_cluster.members if m.endpoint == used)
            member.stop()
            r = s.put("cl/1", b"1", lease=lease).revision
            (ev,) = next_batch(w, 20)
            assert (ev.kv.key, ev.kv.mod_revision) == ("cl/1", r)
            time.sleep(4.0)  # longer than the lease TTL: only renewals on another member keep it
            assert lost.calls == []
            assert s.time_to_live(lease) > 0
            assert s.get("cl/1").kvs[0].lease == lease
            assert reg.client.pool.endpoints[reg.client.pool._current].address != used
        finally:
            ka.cancel()
            w.cancel()


def test_lease_survives_etcd_restart(etcd):
    with registry(etcd.endpoint) as reg:
        s = reg.sync
        lease = s.grant(6)
        s.put("ls/k", b"v", lease=lease)
        lost = LostRecorder()
        ka = on_loop(lambda: reg.keep_alive(lease, 6, lost))
        try:
            mgr = reg.client.leases
            assert wait_until(lambda: mgr._leases[lease].renewed >= 1, 15)
            etcd.members[0].restart()
            before = mgr._leases[lease].renewed
            assert wait_until(lambda: lease in mgr._leases and mgr._leases[lease].renewed > before, 20)
            assert mgr.connects >= 2
            assert lost.calls == []
            assert s.time_to_live(lease) > 0
            assert s.get("ls/k").kvs[0].lease == lease
        finally:
            ka.cancel()


def test_lease_revoked_from_outside_reports_lost_once(etcd):
    with registry(etcd.endpoint) as reg:
        lease = reg.sync.grant(2)
        lost = LostRecorder()
        ka = on_loop(lambda: reg.keep_alive(lease, 2, lost))
        try:
            assert wait_until(lambda: reg.client.leases._leases[lease].renewed >= 1, 15)
            etcd.etcdctl("lease", "revoke", format(lease, "x"))
            assert lost.event.wait(10)
            time.sleep(1.0)
            assert len(lost.calls) == 1
            lid, reason = lost.calls[0]
            assert lid == lease and isinstance(reason, LeaseNotFound)
            assert ka.lost is reason
        finally:
            ka.cancel()


def test_lease_not_renewed_within_ttl_is_reported_lost(etcd):
    with registry(etcd.endpoint, dial_timeout=1.0) as reg:
        lease = reg.sync.grant(2)
        lost = LostRecorder()
        ka = on_loop(lambda: reg.keep_alive(lease, 2, lost))
        try:
            assert wait_until(lambda: reg.client.leases._leases[lease].renewed >= 1, 15)
            etcd.members[0].stop()
            t0 = time.monotonic()
            assert lost.event.wait(10)
            assert time.monotonic() - t0 < 2 + 3  # the TTL, plus slack for a loaded machine
            (lid, reason), = lost.calls
            assert lid == lease and isinstance(reason, RegistryUnavailable)
        finally:
            ka.cancel()
            etcd.members[0].start()


def test_stopped_endpoint_is_never_locked_out(etcd):
    with registry(etcd.endpoint, dial_timeout=1.0) as reg:
        reg.sync.put("lo/k", b"1")
        etcd.members[0].stop()
        with pytest.raises(RegistryUnavailable):
            reg.sync.get("lo/k")
        etcd.members[0].start()
        assert wait_until(lambda: _get_ok(reg, "lo/k"), 15)


def _get_ok(reg, key):
    try:
        return reg.sync.get(key).kvs[0].value == b"1"
    except RegistryUnavailable:
        return False


def test_keep_alive_and_cancel_from_a_plain_thread(shared_etcd, unique_key):
    with registry(shared_etcd.endpoint) as reg:
        lease = reg.sync.grant(1)
        reg.sync.put(unique_key, b"v", lease=lease)
        ka = reg.keep_alive(lease, 1, lambda *_: None)  # not on the control loop
        assert wait_until(lambda: lease in reg.client.leases._leases
                          and reg.client.leases._leases[lease].renewed >= 3, 15)
        assert reg.sync.get(unique_key).kvs
        ka.cancel()
        assert wait_until(lambda: reg.sync.get(unique_key).kvs == [], 15)


def test_cluster_member_frozen_keeps_kv_keepalive_and_watch_going(etcd_cluster):
    with registry(etcd_cluster.endpoints) as reg:
        s = reg.sync
        lease = s.grant(5)
        lost = LostRecorder()
        ka = on_loop(lambda: reg.keep_alive(lease, 5, lost))
        w = reg.watch("fz/", prefix=True)
        try:
            assert wait_until(lambda: w.connected and reg.client.leases.connected, 15)
            used = reg.client.pool.endpoints[reg.client.pool._current].address
            member = next(m for m in etcd_cluster.members if m.endpoint == used)
            member.pause()
            try:
                r = s.put("fz/1", b"1", lease=lease).revision  # fails over within the call's deadline
                (ev,) = next_batch(w, 20)  # the watch moves once the frozen stream is noticed
                assert (ev.kv.key, ev.kv.mod_revision) == ("fz/1", r)
                time.sleep(2.0)
                assert lost.calls == [], lost.calls
                assert s.time_to_live(lease) > 0
            finally:
                member.resume()
        finally:
            ka.cancel()
            w.cancel()
