"""A client talking to an etcd member that is cut off from the majority moves to the healthy members.

Real 3-member clusters whose peer traffic goes through relays that can cut one member off
(``harness/etcd_partition.py``); the client lists the member to be isolated first, so it is the one it uses.
Each test first proves the cut (the member reports no leader, a linearizable read through it gets no
answer), then checks what waypost does through it: with the default timeouts and with
``request_timeout=10``, which makes one attempt on a member wait longer than the callers' own budgets
(the subscriber's read: 3 s; ``Publisher.start()``: 5 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import waypost
from harness.etcd_partition import PartitionCluster, etcdctl, linearizable_read_fails
from harness.waiting import wait_until
from tests.etcd.helpers import run
from waypost import Publisher
from waypost.discovery import Subscriber
from waypost.etcd.local import LocalEtcd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: generous: with the defaults the move takes 2-4 s; "never" is what it must not be
FOLLOW_BOUND = 12.0

OPTIONS = {"default": "", "request_timeout=10": "?request_timeout=10"}


@pytest.fixture
def cluster(tmp_path) -> Iterator[PartitionCluster]:
    pc = PartitionCluster(3, base_dir=tmp_path / "etcd").start()
    try:
        yield pc
    finally:
        pc.close()


def _url(pc: PartitionCluster, first: int, options: str) -> str:
    order = [first] + [i for i in range(len(pc.endpoints)) if i != first]
    return "etcd://" + ",".join(pc.endpoints[i] for i in order) + options


def _current(reg) -> str:
    pool = reg.client.pool
    return pool.endpoints[pool._current].address


def _isolate(pc: PartitionCluster, iso: int) -> None:
    pc.isolate(iso)
    took = pc.wait_leaderless(iso)
    pc.wait_leader_elsewhere(iso)
    assert linearizable_read_fails(pc.endpoints[iso], timeout=2.0), "the isolated member still answers reads"
    print(f"member {iso} leaderless {took:.2f}s after the cut")


@pytest.mark.parametrize("opt", list(OPTIONS), ids=list(OPTIONS))
def test_subscriber_started_on_an_isolated_member_follows_changes(cluster, opt):
    """The subscriber starts while its client's member is cut off: its first (linearizable) read gets no
    answer there, it may return with the member's stale list, and it must then read and watch through the
    healthy members, so a change written through one of them arrives."""
    iso = cluster.follower()
    healthy = cluster.endpoints[(iso + 1) % 3]
    etcdctl(healthy, "put", "part.rpc/1", "10.0.0.1:1")
    reg = waypost.connect(_url(cluster, iso, OPTIONS[opt]))
    try:
        _pin(reg, cluster.endpoints[iso])
        _isolate(cluster, iso)
        etcdctl(healthy, "put", "part.rpc/2", "10.0.0.2:2")  # the isolated member never sees this one
        t0 = time.monotonic()
        sub = Subscriber(reg, "part.rpc", timeout=10)
        try:
            print(f"[{opt}] Subscriber() returned after {time.monotonic() - t0:.2f}s with {sub.values()}"
                  f"{' (stale)' if sub.stale else ''}")
            followed = wait_until(lambda: "10.0.0.2:2" in sub.values() and not sub.stale, FOLLOW_BOUND + 5)
            took = time.monotonic() - t0
            print(f"[{opt}] subscriber showed the change written through a healthy member after {took:.2f}s")
            assert followed, f"[{opt}] the subscriber still shows {sub.values()} {took:.1f}s after it started"
            assert took <= FOLLOW_BOUND, f"[{opt}] the change took {took:.1f}s to arrive (bound {FOLLOW_BOUND}s)"
            etcdctl(healthy, "put", "part.rpc/3", "10.0.0.3:3")  # and it watches through a healthy member
            assert wait_until(lambda: "10.0.0.3:3" in sub.values(), 10), sub.values()
        finally:
            sub.close()
    finally:
        run(reg.close(), 15)


def test_running_subscriber_on_an_isolated_member_follows_changes(cluster):
    """A subscriber already watching through the member when it is cut off: the watch asks for a leader,
    so the member ends it and the watch moves to a healthy member (with a long request timeout too)."""
    iso = cluster.follower()
    healthy = cluster.endpoints[(iso + 1) % 3]
    etcdctl(healthy, "put", "part-run.rpc/1", "10.0.0.1:1")
    reg = waypost.connect(_url(cluster, iso, OPTIONS["request_timeout=10"]))
    try:
        _pin(reg, cluster.endpoints[iso])
        sub = Subscriber(reg, "part-run.rpc")
        try:
            assert sub.values() == ["10.0.0.1:1"]
            assert run(_on_loop_current(reg)) == cluster.endpoints[iso]  # its watch too: pinned before it
            t0 = time.monotonic()
            cluster.isolate(iso)
            etcdctl(healthy, "put", "part-run.rpc/2", "10.0.0.2:2", timeout=10)
            followed = wait_until(lambda: "10.0.0.2:2" in sub.values(), FOLLOW_BOUND + 5)
            took = time.monotonic() - t0
            print(f"running subscriber followed a change after {took:.2f}s from the cut")
            assert followed and took <= FOLLOW_BOUND, (sub.values(), took)
        finally:
            sub.close()
    finally:
        run(reg.close(), 15)


@pytest.mark.parametrize("opt", list(OPTIONS), ids=list(OPTIONS))
def test_publisher_start_through_an_isolated_member_registers_via_the_others(cluster, opt):
    iso = cluster.follower()
    healthy = cluster.endpoints[(iso + 1) % 3]
    reg = waypost.connect(_url(cluster, iso, OPTIONS[opt]))
    try:
        _pin(reg, cluster.endpoints[iso])
        _isolate(cluster, iso)
        pub = Publisher(reg, "part-pub.rpc", "10.0.0.3:3", ttl=10)
        t0 = time.monotonic()
        try:
            pub.start()  # default timeout: 5 s
            took = time.monotonic() - t0
            print(f"[{opt}] Publisher.start() through the isolated member registered after {took:.2f}s")
            assert pub.registered
            assert "10.0.0.3:3" in etcdctl(healthy, "get", "--prefix", "part-pub.rpc/")
        finally:
            pub.stop()
    finally:
        run(reg.close(), 15)


async def _on_loop_current(reg) -> str:
    return _current(reg)


def _pin(reg, address: str) -> None:
    """Make ``address`` the member the client uses (connected), as the first of the URL's list would be; the
    first connection may have gone to another member that connected sooner."""
    async def pin() -> str:
        pool = reg.client.pool
        pool._current = next(i for i, ep in enumerate(pool.endpoints) if ep.address == address)
        await reg.client.range(b"pin", serializable=True)
        return _current(reg)

    for _ in range(50):
        if run(pin()) == address:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not make the client use {address}")


# -- a member that answers nothing at all (frozen: SIGSTOP): no "no leader" answer to rely on -------------------
# Each attempt on it waits until a deadline; with request_timeout=10 one attempt alone (5 s) would outlast the
# callers' own budgets, unless the caller's budget is split between attempts (Publisher.start()) or a caller
# that gave up marks the member so that its next try goes elsewhere (the subscriber's reads).


@pytest.fixture
def plain_cluster(tmp_path) -> Iterator[LocalEtcd]:
    c = LocalEtcd(3, base_dir=tmp_path / "etcd").start()
    try:
        yield c
    finally:
        c.close()


def _frozen_first(c, options: str) -> tuple[int, str, str]:
    leader = c.leader()
    iso = next(i for i, m in enumerate(c.members) if m is not leader)
    healthy = c.endpoints[(iso + 1) % 3]
    order = [iso] + [i for i in range(3) if i != iso]
    return iso, healthy, "etcd://" + ",".join(c.endpoints[i] for i in order) + options


def test_publisher_start_through_a_frozen_member_registers_via_the_others(plain_cluster):
    iso, healthy, url = _frozen_first(plain_cluster, "?request_timeout=10")
    reg = waypost.connect(url)
    try:
        _pin(reg, plain_cluster.endpoints[iso])
        plain_cluster.members[iso].pause()
        pub = Publisher(reg, "frozen-pub.rpc", "10.0.0.4:4", ttl=10)
        t0 = time.monotonic()
        try:
            pub.start()  # 5 s
            print(f"Publisher.start() through a frozen member registered after {time.monotonic() - t0:.2f}s")
            assert pub.registered
            assert "10.0.0.4:4" in etcdctl(healthy, "get", "--prefix", "frozen-pub.rpc/")
        finally:
            pub.stop()
    finally:
        plain_cluster.members[iso].resume()
        run(reg.close(), 15)


def test_subscriber_started_on_a_frozen_member_follows_changes(plain_cluster):
    iso, healthy, url = _frozen_first(plain_cluster, "?request_timeout=10")
    etcdctl(healthy, "put", "frozen.rpc/1", "10.0.0.1:1")
    reg = waypost.connect(url)
    try:
        _pin(reg, plain_cluster.endpoints[iso])
        plain_cluster.members[iso].pause()
        etcdctl(healthy, "put", "frozen.rpc/2", "10.0.0.2:2")
        t0 = time.monotonic()
        sub = Subscriber(reg, "frozen.rpc", timeout=10)
        try:
            followed = wait_until(lambda: "10.0.0.2:2" in sub.values() and not sub.stale, FOLLOW_BOUND + 5)
            took = time.monotonic() - t0
            print(f"subscriber started on a frozen member showed the live list after {took:.2f}s")
            assert followed and took <= FOLLOW_BOUND, (sub.values(), took)
        finally:
            sub.close()
    finally:
        plain_cluster.members[iso].resume()
        run(reg.close(), 15)


def test_a_call_whose_caller_gave_up_on_a_silent_member_moves_the_next_one(plain_cluster):
    """No deadline of the client fired (request_timeout=10: 5 s per attempt), the caller's own 2 s did: the
    member is suspect all the same, and the next call goes to another one."""
    iso, _healthy, url = _frozen_first(plain_cluster, "?request_timeout=10")
    reg = waypost.connect(url)
    try:
        _pin(reg, plain_cluster.endpoints[iso])
        plain_cluster.members[iso].pause()
        with pytest.raises(asyncio.TimeoutError):
            run(asyncio.wait_for(reg.get("gave-up/"), 2.0))
        assert run(_on_loop_current(reg)) != plain_cluster.endpoints[iso]  # before any other call
        reg.sync.get("gave-up/")
    finally:
        plain_cluster.members[iso].resume()
        run(reg.close(), 15)
