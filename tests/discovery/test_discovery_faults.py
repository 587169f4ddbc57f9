"""Discovery under faults, against real etcd processes (restart, freeze, compaction, member loss)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from harness.waiting import wait_until
from tests.etcd.helpers import run
from waypost import Publisher
from waypost.discovery import Subscriber
from waypost.discovery.connections import connect
from waypost.errors import PermissionDenied


def _registered(reg, key_prefix: str) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in reg.sync.get(key_prefix, prefix=True).kvs}


@pytest.fixture
def etcd_reg(etcd):
    reg = connect(etcd.url())
    yield reg
    run(reg.close(), 10)


def test_etcd_restart_keeps_registrations_and_subscriber_sees_final_set(etcd, etcd_reg):
    reg = etcd_reg
    a = Publisher(reg, "rs.rpc", "127.0.0.1:7101", ttl=3).start()
    b = Publisher(reg, "rs.rpc", "127.0.0.1:7102", ttl=3).start()
    sub = Subscriber(reg, "rs.rpc")
    c = Publisher(reg, "rs.rpc", "127.0.0.1:7103", ttl=3)
    try:
        assert sorted(sub.values()) == ["127.0.0.1:7101", "127.0.0.1:7102"]
        etcd.members[0].stop()
        time.sleep(4.5)  # longer than the TTL: the publishers cannot renew meanwhile
        assert sorted(sub.values()) == ["127.0.0.1:7101", "127.0.0.1:7102"]  # last known values stay
        etcd.members[0].start()
        wait_until(lambda: a.registered and b.registered, 30)
        c.start()
        a.stop()
        want = ["127.0.0.1:7102", "127.0.0.1:7103"]
        wait_until(lambda: sorted(sub.values()) == want, 30, "the subscriber sees both addresses")
        # exactly one record per live publisher in etcd (a lost lease's old key was revoked)
        wait_until(lambda: sorted(_registered(reg, "rs.rpc/").values()) == [w.encode() for w in want], 30)
        assert set(_registered(reg, "rs.rpc/")) == {b.key, c.key}
    finally:
        sub.close()
        for p in (a, b, c):
            p.stop()


_FROZEN_PUBLISHER = textwrap.dedent("""
    import sys, time
    from waypost import Publisher
    pub = Publisher(sys.argv[1], "frozen.rpc", "127.0.0.1:7201", ttl=2).start()
    print("ready", pub.key, flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
""")


def test_frozen_publisher_process_registers_again_after_sigcont(etcd, etcd_reg):
    reg = etcd_reg
    proc = subprocess.Popen([sys.executable, "-c", _FROZEN_PUBLISHER, etcd.url()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("ready "), line + (proc.stderr.read() if proc.poll() is not None else "")
        first_key = line.split()[1]
        assert _registered(reg, "frozen.rpc/") == {first_key: b"127.0.0.1:7201"}
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: _registered(reg, "frozen.rpc/") == {}, 20, "the lease expires while the publisher is frozen")
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGCONT)
        t0 = time.monotonic()
        wait_until(lambda: list(_registered(reg, "frozen.rpc/").values()) == [b"127.0.0.1:7201"], 10)
        took = time.monotonic() - t0
        print(f"re-registered {took:.2f}s after SIGCONT")
        assert took < 2.0, f"registered again only after {took:.2f}s"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


def test_compaction_past_the_subscribers_revision_loses_nothing(etcd, etcd_reg):
    reg = etcd_reg
    pubs = [Publisher(reg, "cp.rpc", f"127.0.0.1:{7300 + i}", ttl=10).start() for i in range(12)]
    sub = Subscriber(reg, "cp.rpc")
    fired = threading.Event()
    sub.add_listener(fired.set)
    group = sub._group
    assert group is not None
    try:
        assert len(sub.values()) == 12

        async def stall():
            for src in group.sources:
                src.task.cancel()
                await asyncio.gather(src.task, return_exceptions=True)

        run(stall())
        for p in pubs[:4]:
            p.stop()
        pubs += [Publisher(reg, "cp.rpc", f"127.0.0.1:{7400 + i}", ttl=10).start() for i in range(4)]
        reg.sync.put("cp.rpc/manual", b"127.0.0.1:7500")
        reg.sync.put("cp.rpc/manual", b"127.0.0.1:7501")  # a value change while stalled
        etcd.compact()
        assert len(sub.values()) == 12  # stale but intact while the watch is down

        async def resume():
            for src in group.sources:
                src.task = asyncio.create_task(group._watch_loop(src))

        fired.clear()
        run(resume())
        want = sorted(v.decode() for v in _registered(reg, "cp.rpc/").values())
        assert len(want) == 13 and "127.0.0.1:7501" in want and "127.0.0.1:7500" not in want
        wait_until(lambda: sorted(sub.values()) == want, 15)
        assert fired.is_set()
    finally:
        sub.close()
        for p in pubs:
            p.stop()


def test_losing_one_member_of_three_loses_nothing(etcd_cluster):
    reg = connect(etcd_cluster.url())
    pubs = [Publisher(reg, "m3.rpc", f"127.0.0.1:{7600 + i}", ttl=2).start() for i in range(3)]
    sub = Subscriber(reg, "m3.rpc")
    try:
        want = sorted(f"127.0.0.1:{7600 + i}" for i in range(3))
        assert sorted(sub.values()) == want
        etcd_cluster.leader().stop()
        time.sleep(5.0)  # two and a half TTLs without the old leader
        assert sorted(sub.values()) == want
        wait_until(lambda: all(p.registered for p in pubs), 15)
        wait_until(lambda: sorted(v.decode() for v in _registered(reg, "m3.rpc/").values()) == want, 15)
        late = Publisher(reg, "m3.rpc", "127.0.0.1:7699", ttl=2).start()
        pubs.append(late)
        wait_until(lambda: sorted(sub.values()) == sorted([*want, "127.0.0.1:7699"]), 15)
    finally:
        sub.close()
        for p in pubs:
            p.stop()
        run(reg.close(), 10)


def test_refused_credentials_are_permission_denied_not_unavailable(etcd):
    etcd.etcdctl("user", "add", "root", "--new-user-password=r00t-pw")
    etcd.etcdctl("auth", "enable")
    reg = connect(etcd.url("root", "wrong-pw"))
    try:
        with pytest.raises(PermissionDenied):
            Publisher(reg, "auth.rpc", "127.0.0.1:7700", ttl=5, timeout=5).start()
        t0 = time.monotonic()
        with pytest.raises(PermissionDenied):
            Subscriber(reg, "auth.rpc", timeout=30)
        # Refused on the first answer: ~0.08 s measured on an idle machine (etcd's password hash check);
        # 5 s leaves a loaded 2-core machine 60x that, and fails if the refusal were retried like an
        # outage (backoff rounds) or waited for the 30 s load timeout.
        elapsed = time.monotonic() - t0
        assert elapsed < 5, f"refused only after {elapsed:.2f} s: a refusal must not be retried"
    finally:
        run(reg.close(), 10)
    good = connect(etcd.url("root", "r00t-pw"))
    try:
        with Publisher(good, "auth.rpc", "127.0.0.1:7700", ttl=5) as pub, Subscriber(good, "auth.rpc") as sub:
            assert pub.registered and sub.values() == ["127.0.0.1:7700"]
    finally:
        run(good.close(), 10)
