"""Chaos scenarios about the etcd store and the link to it, in the style of ``etcd_faults``: an etcd
that comes back with an older store (data directory wiped, or restored from a snapshot) and a slow but
working link under a publisher. Used by ``bench/chaos_report.py`` (table and JSON); the same promises
are asserted, on a smaller setup, by ``tests/etcd/test_etcd_store_reset.py`` and ``tests/etcd/test_etcd_slow_link.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from harness.backends.server import EchoServer
from harness.chaos.load import Load, etcd_target, loaded_channel, nodes
from harness.chaos.observe import LOG, close_registry, private_registry, registered_values
from harness.chaos.result import Result
from harness.latency_proxy import LatencyProxy
from harness.waiting import holds_within
from waypost import Publisher, _loop
from waypost.etcd.config import EtcdConfig
from waypost.etcd.local import LocalEtcd, find_binary
from waypost.registries.etcd.store import EtcdRegistry


def _bump(reg: EtcdRegistry, key: str, n: int) -> None:
    for i in range(n):
        _loop.run(reg.put(key, str(i).encode()), 10)


#: a wiped store holds no registration until the publishers register again (their keepalive finds the
#: lease gone): calls fail meanwhile with "no backends", for at most this long after etcd is back
REREGISTER_WINDOW = 3.0


def etcd_store_gone_back(etcd: LocalEtcd, how: str = "wiped", key: str = "chaos-wipe.rpc") -> Result:
    """etcd at revision ~60 with two registered backends under load is SIGKILLed and comes back with an
    older store: an empty data directory (``how="wiped"``) or the snapshot taken before 20 more writes
    (``how="restored"``). The publishers register again (wiped) or keep their restored records, the
    channel keeps serving (after a wipe, except while no publisher has registered again: bounded by
    ``REREGISTER_WINDOW``), and a backend registered afterwards gets traffic: recovery is the time from
    etcd's return until it does."""
    what = "data dir wiped" if how == "wiped" else "restored from snapshot"
    r = Result(f"etcd SIGKILL, {what}", bound_s=10.0, recovery_what="new backend served after etcd returns")
    member = etcd.members[0]
    probe = private_registry(etcd.endpoints)
    try:
        _bump(probe, f"{key}-bump", 56)
        with nodes(etcd.url(), key, ["a", "b"], ttl=5) as (a, b), \
                loaded_channel(etcd_target(etcd.endpoints, key), warm=2) as (_ch, load), \
                tempfile.TemporaryDirectory(prefix="waypost-chaos-snap-") as tmp:
            want = {a.address, b.address}
            snap = Path(tmp) / "backup.db"
            if how == "restored":
                etcd.etcdctl("snapshot", "save", str(snap))
                _bump(probe, f"{key}-bump", 20)
            close_registry(probe)
            t_kill = time.monotonic()
            member.kill()
            shutil.rmtree(member.data_dir)
            if how == "restored":
                peer = f"http://{member.host}:{member.peer_port}"
                subprocess.run([find_binary("etcdutl"), "snapshot", "restore", str(snap),
                                "--data-dir", str(member.data_dir), "--name", member.name,
                                "--initial-cluster", f"{member.name}={peer}", "--initial-cluster-token",
                                "waypost-local", "--initial-advertise-peer-urls", peer],
                               check=True, capture_output=True, timeout=30)
            member.cluster_state = "new"
            member.start()
            t_back = time.monotonic()
            probe = private_registry(etcd.endpoints)
            back = holds_within(lambda: registered_values(probe, key) == want, 30)
            seen = registered_values(probe, key) or set()
            r.lost = len(want - seen)
            r.check(back, f"registrations after etcd's return: {sorted(seen)}, expected {sorted(want)}")
            with nodes(etcd.url(), key, ["late"]) as (_late,):
                got = holds_within(lambda: "late" in load.servers_after(t_back), 30)
                r.recovery_s = round(time.monotonic() - t_back, 3)
                r.check(got, "a backend registered after etcd's return never got traffic (watch stuck)")
                r.check(r.recovery_s <= (r.bound_s or 0), f"new backend served only {r.recovery_s} s after "
                                                          "etcd returned")
            load.stop()
            _fill_allowing_window(r, load, t_kill, t_back + REREGISTER_WINDOW if how == "wiped" else t_kill)
    finally:
        close_registry(probe)
    return r


def _fill_allowing_window(r: Result, load: Load, start: float, end: float) -> None:
    """Like ``Load.fill``, but failures between ``start`` and ``end`` are expected (the store held no
    registration then); their span is reported."""
    r.sent, r.failed = load.sent, len(load.failed)
    if not load.failed:
        return
    times = [t for t, _, _ in load.failed]
    r.details["failures"] = load.failed[:3]
    r.details["failures_span_s"] = round(max(times) - min(times), 3)
    r.details["log_around_first_failure"] = LOG.around(times[0])
    outside = [f for f in load.failed if not start <= f[0] <= end]
    r.check(not outside, f"{len(outside)} of {load.sent} RPCs failed outside the re-registration window: "
                         f"{outside[:3]}")


def slow_link_publisher(etcd: LocalEtcd, delay: float = 0.9, ttl: int = 5, observe_s: float = 20.0,
                        key: str = "chaos-slow.rpc") -> Result:
    """A publisher whose link to etcd adds ``delay`` seconds each way, watched for ``observe_s`` seconds
    under load: it must keep one key under one lease (no re-registration), and its backend must never
    drop out of etcd. Recovery is the longest time its record was missing (bound 0)."""
    r = Result(f"publisher link +{delay:g} s each way (TTL {ttl} s)", bound_s=0.0,
                  recovery_what="longest time the record was missing")
    host, port = etcd.endpoint.rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), delay=delay)
    slow = EtcdRegistry(EtcdConfig(endpoints=(proxy.endpoint,), dial_timeout=10.0, request_timeout=10.0))
    probe = private_registry(etcd.endpoints)
    server = EchoServer("slow").start()
    pub = None
    try:
        pub = Publisher(slow, key, server.address, ttl=ttl, timeout=30.0).start()
        first = (pub.key, pub.lease_id)
        with loaded_channel(etcd_target(etcd.endpoints, key), warm=1) as (_ch, load):
            missing_since: float | None = None
            longest = 0.0
            end = time.monotonic() + observe_s
            while time.monotonic() < end:
                seen = registered_values(probe, key)
                now = time.monotonic()
                if seen is not None and server.address not in seen:
                    missing_since = missing_since or now
                    longest = max(longest, now - missing_since)
                elif seen is not None:
                    missing_since = None
                time.sleep(0.2)
            r.recovery_s = round(longest, 3)
            r.lost = pub.registrations - 1  # registrations made again after a lease counted as lost
            r.details["key_and_lease_unchanged"] = (pub.key, pub.lease_id) == first
            r.check(r.lost == 0, f"registered {r.lost} more time(s): a live lease was counted as lost")
            r.check(longest == 0.0, f"the record was missing for {longest:.1f} s")
            r.check((pub.key, pub.lease_id) == first, "key or lease changed")
            load.stop()
            load.fill(r)
    finally:
        if pub is not None:
            pub.stop()
        server.stop(0)
        close_registry(slow)
        close_registry(probe)
        proxy.close()
    return r
