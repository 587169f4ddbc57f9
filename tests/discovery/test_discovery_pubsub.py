"""Publisher and Subscriber against the memory registry and a real etcd (the same tests)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import pytest

import waypost
from harness.waiting import wait_until
from tests.etcd.helpers import run
from waypost import Publisher, _loop
from waypost.discovery import Subscriber, active_subscriptions
from waypost.discovery import subscriber as submod
from waypost.errors import RegistryUnavailable
from waypost.registries.memory.store import MemoryRegistry


def _group(sub: Subscriber) -> submod.SharedReader:
    assert sub._group is not None
    return sub._group


def test_publish_then_subscribe_then_stop(registry):
    pub = Publisher(registry, "svc.rpc", "127.0.0.1:7001", ttl=5).start()
    try:
        assert pub.registered and pub.lease_id > 0
        assert pub.key == f"svc.rpc/{pub.lease_id}"  # go-zero: the lease id in decimal
        kv = registry.sync.get(pub.key).kvs[0]
        assert (kv.value, kv.lease) == (b"127.0.0.1:7001", pub.lease_id)
        with Subscriber(registry, "svc.rpc") as sub:
            assert sub.values() == ["127.0.0.1:7001"]
            pub.stop()
            assert registry.sync.get("svc.rpc/", prefix=True).kvs == []
            wait_until(lambda: sub.values() == [], 10)
    finally:
        pub.stop()
    pub.stop()  # idempotent
    assert pub.state == "stopped" and not pub.registered and pub.key is None


def test_custom_id_key(registry):
    with Publisher(registry, "cid.rpc", "127.0.0.1:7002", ttl=5, id=42) as pub:
        assert pub.key == "cid.rpc/42"
        assert registry.sync.get("cid.rpc/42").kvs[0].value == b"127.0.0.1:7002"


def test_pause_resume_stop(registry):
    with Subscriber(registry, "pr.rpc") as sub, Publisher(registry, "pr.rpc", "127.0.0.1:7003", ttl=5) as pub:
        wait_until(lambda: sub.values() == ["127.0.0.1:7003"], 10)
        first = pub.lease_id
        pub.pause()
        assert not pub.registered and pub.state == "paused"
        assert registry.sync.get("pr.rpc/", prefix=True).kvs == []  # gone at once
        assert registry.sync.time_to_live(first) == -1
        wait_until(lambda: sub.values() == [], 10)
        pub.pause()  # no-op
        pub.resume()
        assert pub.registered and pub.lease_id not in (0, first)
        wait_until(lambda: sub.values() == ["127.0.0.1:7003"], 10)
        pub.stop()
        wait_until(lambda: sub.values() == [], 10)
        pub.resume()  # after stop: nothing happens
        assert not pub.registered


def test_subscriber_sees_adds_deletes_and_value_changes_on_the_watch_path(registry):
    s = registry.sync
    s.put("wp.rpc/1", b"10.0.0.1:1")
    with Subscriber(registry, "wp.rpc") as sub:
        assert sub.values() == ["10.0.0.1:1"]
        fired = threading.Event()
        sub.add_listener(fired.set)
        s.put("wp.rpc/2", b"10.0.0.2:1")
        assert fired.wait(10)
        wait_until(lambda: sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:1"], 10)
        s.put("wp.rpc/1", b"10.0.0.3:1")  # value change of an existing key
        wait_until(lambda: sorted(sub.values()) == ["10.0.0.2:1", "10.0.0.3:1"], 10)
        s.delete("wp.rpc/2")
        wait_until(lambda: sub.values() == ["10.0.0.3:1"], 10)
        # a key outside the prefix is not ours
        s.put("wp.rpcx/9", b"10.0.0.9:1")
        s.put("wp.rpc/3", b"10.0.0.4:1")
        wait_until(lambda: sorted(sub.values()) == ["10.0.0.3:1", "10.0.0.4:1"], 10)


def test_hundred_duplicate_puts_one_value(registry):
    s = registry.sync
    with Subscriber(registry, "dup.rpc") as sub:
        for i in range(100):
            s.put(f"dup.rpc/{i}", b"10.0.0.1:1")
        wait_until(lambda: len(sub.container.keys()) == 100, 10)
        assert sub.values() == ["10.0.0.1:1"]


def test_exact_mode_reads_only_the_key(registry):
    s = registry.sync
    s.put("ex.rpc", b"10.0.0.1:1")
    s.put("ex.rpc/1", b"10.0.0.2:1")
    with Subscriber(registry, "ex.rpc", exact=True) as sub:
        assert sub.values() == ["10.0.0.1:1"]
        s.put("ex.rpc", b"10.0.0.3:1")
        wait_until(lambda: sub.values() == ["10.0.0.3:1"], 10)


def test_exclusive_subscriber_keeps_the_newest_key(registry):
    s = registry.sync
    s.put("xs.rpc/1", b"10.0.0.1:1")
    s.put("xs.rpc/2", b"10.0.0.1:1")
    with Subscriber(registry, "xs.rpc", exclusive=True) as sub:
        assert list(sub.container.keys()) == ["xs.rpc/2"]
        s.put("xs.rpc/3", b"10.0.0.1:1")
        wait_until(lambda: list(sub.container.keys()) == ["xs.rpc/3"], 10)
        assert sub.values() == ["10.0.0.1:1"]


def test_bad_values_are_skipped_and_never_hide_good_ones(registry):
    s = registry.sync
    s.put("bad.rpc/1", b"10.0.0.1:1")
    s.put("bad.rpc/2", b"\xff\xfe garbage")
    with Subscriber(registry, "bad.rpc") as sub:
        assert sub.values() == ["10.0.0.1:1"]
        s.put("bad.rpc/3", b"x" * 70_000)
        s.put("bad.rpc/4", b"10.0.0.4:1")
        wait_until(lambda: sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.4:1"], 10)
        s.put("bad.rpc/1", b"not an address")  # a good key turning bad disappears
        wait_until(lambda: sub.values() == ["10.0.0.4:1"], 10)


def test_metadata_reaches_backends_in_every_format(registry):
    for fmt in ("gozero", "etcd-naming", "kratos"):
        key = f"md-{fmt}.rpc"
        with Subscriber(registry, key, format=fmt) as sub, \
                Publisher(registry, key, "127.0.0.1:7010", ttl=5, metadata={"weight": 20, "zone": "b"},
                          format=fmt, id="inst-1"):
            wait_until(lambda sub=sub: len(sub.backends()) == 1, 10, f"one backend in format {fmt}")
            # the first sight of the address already carries its metadata (go-zero: a side record)
            (b,) = sub.backends()
            want = {"weight": "20", "zone": "b"} if fmt == "kratos" else {"weight": 20, "zone": "b"}
            assert b.address == "127.0.0.1:7010" and dict(b.metadata) == want, fmt


def test_gozero_metadata_arrives_with_the_address_when_the_side_watch_lags(registry):
    # etcd does not order events across two watches: stop the side watch entirely, so the only
    # way the metadata can arrive with the address is the subscriber reading it itself
    key = "lagmd.rpc"
    seen: list[tuple] = []
    with Subscriber(registry, key) as sub:
        group = _group(sub)
        assert group.side is not None

        async def stop_side_watch():
            group.side.task.cancel()
        run(stop_side_watch())
        sub.add_listener(lambda: seen.append(sub.backends()))
        with Publisher(registry, key, "127.0.0.1:7011", ttl=5, metadata={"weight": 7}, id="a"):
            wait_until(lambda: len(sub.backends()) == 1, 10)
            assert seen and all(dict(b.metadata) == {"weight": 7} for bs in seen for b in bs), seen
        # a Go publisher (no side record) still appears, without metadata
        registry.sync.put(f"{key}/9", b"127.0.0.1:7012")
        wait_until(lambda: [b.address for b in sub.backends()] == ["127.0.0.1:7012"], 10)
        assert dict(sub.backends()[0].metadata) == {}


def test_gozero_metadata_written_between_the_two_initial_reads_is_not_lost(registry):
    # the side prefix and the addresses are read at once: a registration landing after the side
    # read but before the address read must still come with its metadata (the side prefix is read
    # again). Here the address read is held until the registration is in.
    key = "racemd.rpc"
    orig_load, orig_get = submod.SharedReader._load, submod.SharedReader._get
    calls = []
    injected = []

    async def load(self, src, read=None):
        await orig_load(self, src, read)
        calls.append(src.side)
        if src.side and len(calls) == 1 and self.key == key:  # after the first side read
            await self.registry.put(f"_waypost/meta/{key}/z", b'{"addr":"127.0.0.1:7013","metadata":{"w":1}}')
            await self.registry.put(f"{key}/z", b"127.0.0.1:7013")
            injected.append(True)

    async def get(self, src):
        while self.key == key and not src.side and not injected:
            await asyncio.sleep(0.005)
        return await orig_get(self, src)

    submod.SharedReader._load, submod.SharedReader._get = load, get
    try:
        with Subscriber(registry, key) as sub:
            (b,) = sub.backends()
            assert (b.address, dict(b.metadata)) == ("127.0.0.1:7013", {"w": 1})
        assert calls == [True, False, True]
    finally:
        submod.SharedReader._load, submod.SharedReader._get = orig_load, orig_get
        registry.sync.delete(f"_waypost/meta/{key}/", prefix=True)
        registry.sync.delete(f"{key}/", prefix=True)


def test_one_shared_watch_per_key_unmonitored_on_last_close(registry):
    key = "share.rpc"
    a = Subscriber(registry, key)
    b = Subscriber(registry, key)
    c = Subscriber(registry, key, format="etcd-naming")
    try:
        assert _group(a) is _group(b) and _group(c) is not _group(a)
        mine = [d for d in active_subscriptions() if f"'{key}/'" in d]
        assert len(mine) == 2
        group = _group(a)
        a.close()
        a.close()  # idempotent
        assert not group._closed
        registry.sync.put(f"{key}/1", b"10.0.0.1:1")
        wait_until(lambda: b.values() == ["10.0.0.1:1"], 10)
        assert a.values() == []  # a closed subscriber gets no more updates
        b.close()
        assert group._closed
        assert all(src.task is None or src.task.done() or src.task.cancelled() for src in group.sources) or \
            wait_until(lambda: all(src.task.done() for src in group.sources if src.task), 5)
        assert [d for d in active_subscriptions() if f"'{key}/'" in d] == [repr(_group(c))]
        # a new subscriber after the last close starts a fresh watch and sees the current state
        with Subscriber(registry, key) as d:
            assert _group(d) is not group and d.values() == ["10.0.0.1:1"]
    finally:
        for s in (a, b, c):
            s.close()


def test_reload_applies_value_changes_deletes_and_adds(registry):
    """Stall the watch, change things, compact past it: the reload diff must land every change."""
    s = registry.sync
    for i in range(1, 4):
        s.put(f"rl.rpc/{i}", f"10.0.0.{i}:1".encode())
    with Subscriber(registry, "rl.rpc") as sub:
        group = _group(sub)
        src = group.main

        async def stall():
            src.task.cancel()
            await asyncio.gather(src.task, return_exceptions=True)

        run(stall())
        s.put("rl.rpc/1", b"10.0.1.1:1")  # value change
        s.delete("rl.rpc/2")
        r = s.put("rl.rpc/4", b"10.0.0.4:1").revision
        s.compact(r)
        assert sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]  # last known values stay
        reloads = group.reloads

        async def resume():
            src.task = asyncio.create_task(group._watch_loop(src))

        run(resume())
        wait_until(lambda: sorted(sub.values()) == ["10.0.0.3:1", "10.0.0.4:1", "10.0.1.1:1"], 10)
        assert group.reloads >= reloads + 1
        s.put("rl.rpc/5", b"10.0.0.5:1")  # and the watch continues after the reload
        wait_until(lambda: "10.0.0.5:1" in sub.values(), 10)


def test_key_deleted_from_outside_is_put_back(registry):
    with Publisher(registry, "del.rpc", "127.0.0.1:7020", ttl=10, metadata={"w": 1}) as pub:
        key, lease = pub.key, pub.lease_id
        registry.sync.delete(key)
        wait_until(lambda: registry.sync.get(key).kvs != [], 1.5, "the deleted record put back within ~1 s")
        kv = registry.sync.get(key).kvs[0]
        assert (kv.value, kv.lease) == (b"127.0.0.1:7020", lease)


def _records(registry, prefix: str) -> dict[str, tuple[bytes, int]]:
    return {kv.key: (kv.value, kv.lease) for kv in registry.sync.get(prefix, prefix=True).kvs}


def _weights(sub) -> list[object]:
    return [b.metadata.get("weight") for b in sub.backends()]


def test_metadata_side_record_deleted_with_etcdctl_is_put_back(etcd):
    reg = waypost.connect(etcd.url())
    try:
        with Publisher(reg, "side.rpc", "127.0.0.1:7024", ttl=10, metadata={"weight": 7}) as pub, \
                Subscriber(reg, "side.rpc") as sub:
            wait_until(lambda: _weights(sub) == [7], 10, "the subscriber sees weight 7")
            side = _records(reg, "_waypost/meta/side.rpc/")
            assert [lease for _, lease in side.values()] == [pub.lease_id]
            etcd.etcdctl("del", "--prefix", "_waypost/meta/side.rpc/")
            wait_until(lambda: _records(reg, "_waypost/meta/side.rpc/") == side, 2,
                       "the metadata side record put back under the same lease")
            wait_until(lambda: _weights(sub) == [7], 2, "the subscriber sees weight 7 again")
            assert pub.registrations == 1  # put back, not registered again
    finally:
        run(reg.close(), 10)


@pytest.mark.parametrize("gap", ["at once", "once the first is back"])
@pytest.mark.parametrize("first", ["address", "metadata"])
def test_both_records_deleted_one_after_the_other_are_both_put_back(etcd, first, gap):
    # The registration is the address record and its metadata side record: whichever goes first, and
    # whether the other follows at once or just after the first was put back, both come back under the
    # one lease.
    reg = waypost.connect(etcd.url())
    try:
        with Publisher(reg, "both.rpc", "127.0.0.1:7025", ttl=10, metadata={"weight": 7}) as pub, \
                Subscriber(reg, "both.rpc") as sub:
            wait_until(lambda: _weights(sub) == [7], 10, "the subscriber sees weight 7")
            prefixes = ["both.rpc/", "_waypost/meta/both.rpc/"]
            if first == "metadata":
                prefixes.reverse()
            want = [_records(reg, p) for p in prefixes]
            assert all(len(w) == 1 for w in want)
            assert {lease for w in want for _, lease in w.values()} == {pub.lease_id}
            reg.sync.delete(prefixes[0], prefix=True)
            if gap != "at once":
                wait_until(lambda: _records(reg, prefixes[0]) == want[0], 2, f"the {first} record put back")
            reg.sync.delete(prefixes[1], prefix=True)
            wait_until(lambda: [_records(reg, p) for p in prefixes] == want, 2,
                       "both records put back under the same lease")
            wait_until(lambda: [(b.address, b.metadata.get("weight")) for b in sub.backends()]
                       == [("127.0.0.1:7025", 7)], 2, "the subscriber sees the address with weight 7 again")
            assert pub.registrations == 1
    finally:
        run(reg.close(), 10)


def test_lease_revoked_from_outside_registers_again(registry):
    with Subscriber(registry, "rev.rpc") as sub, Publisher(registry, "rev.rpc", "127.0.0.1:7021", ttl=10) as pub:
        old_lease = pub.lease_id
        registry.sync.revoke(old_lease)
        wait_until(lambda: pub.registered and pub.lease_id not in (0, old_lease), 10)
        assert registry.sync.get(pub.key).kvs[0].lease == pub.lease_id
        assert pub.registrations == 2
        wait_until(lambda: sub.values() == ["127.0.0.1:7021"], 10)


def test_exclusive_publisher_takes_over_stale_keys(registry):
    s = registry.sync
    s.put("tk.rpc/111", b"127.0.0.1:7030")
    s.put("tk.rpc/222", b"127.0.0.1:7031")
    with Publisher(registry, "tk.rpc", "127.0.0.1:7030", ttl=5, exclusive=True) as pub:
        keys = {kv.key: kv.value for kv in s.get("tk.rpc/", prefix=True).kvs}
        assert keys == {pub.key: b"127.0.0.1:7030", "tk.rpc/222": b"127.0.0.1:7031"}


def test_async_twins_from_another_event_loop(registry):
    async def main():
        pub = Publisher(registry, "aio.rpc", "127.0.0.1:7040", ttl=5)
        async with pub:
            sub = await Subscriber.open(registry, "aio.rpc")
            async with sub:
                assert sub.values() == ["127.0.0.1:7040"]
                await pub.apause()
                assert not pub.registered
                await pub.aresume()
                assert pub.registered
        assert pub.state == "stopped"

    asyncio.run(main())


def test_bad_arguments_fail_clearly(registry):
    with pytest.raises(ValueError, match="address"):
        Publisher(registry, "k", "no-port")
    with pytest.raises(ValueError, match="ttl"):
        Publisher(registry, "k", "1.2.3.4:1", ttl=0)
    with pytest.raises(ValueError, match="known formats"):
        Subscriber(registry, "k", format="consul")
    with pytest.raises(ValueError, match="key"):
        Subscriber(registry, "")
    assert _loop.get_loop().is_running()


def test_unreachable_registry_fails_fast():
    from waypost.etcd.local import free_port

    url = f"etcd://127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnavailable):
        Publisher(url, "un.rpc", "127.0.0.1:7050", timeout=1.0).start()
    with pytest.raises(RegistryUnavailable):
        Subscriber(url, "un.rpc", timeout=1.0)
    assert not [d for d in active_subscriptions() if "'un.rpc/'" in d]


class _GrantFails(MemoryRegistry):
    """The memory registry, with lease grants refused while ``failures`` > 0 (an unreachable etcd)."""

    failures = 0

    async def grant(self, ttl):
        if self.failures > 0:
            self.failures -= 1
            raise RegistryUnavailable("etcd unreachable (injected)")
        return await super().grant(ttl)


def test_re_registration_logs_a_failure_once_per_state_change(caplog):
    caplog.set_level(logging.DEBUG, logger="waypost.discovery")
    reg = _GrantFails("log-once")
    try:
        with Publisher(reg, "lo.rpc", "127.0.0.1:7060", ttl=5, retry_interval=0.05,
                       rng=random.Random(1)) as pub:
            first = pub.lease_id
            reg.failures = 4
            reg.sync.revoke(first)  # lost: re-register, 4 refusals, then success
            wait_until(lambda: pub.registered and pub.lease_id != first, 10)
            msgs = [(r.levelno, r.getMessage()) for r in caplog.records if "7060" in r.getMessage()]
            assert sum("lost" in m and lv == logging.WARNING for lv, m in msgs) == 1
            assert sum("registering failed, retrying" in m and lv == logging.WARNING for lv, m in msgs) == 1
            assert sum("registering failed again" in m and lv == logging.DEBUG for lv, m in msgs) == 3
            assert sum("registered again after failures" in m for _, m in msgs) == 1
            assert pub.registrations == 2
    finally:
        MemoryRegistry.drop("log-once")


def test_non_exclusive_subscribers_share_one_container_with_their_own_listeners(registry):
    s = registry.sync
    s.put("sc.rpc/1", b"10.0.0.1:1")
    a, b = Subscriber(registry, "sc.rpc"), Subscriber(registry, "sc.rpc")
    x = Subscriber(registry, "sc.rpc", exclusive=True)
    try:
        assert a.container is b.container and x.container is not a.container
        got_a, got_b = threading.Event(), threading.Event()
        a.add_listener(got_a.set)
        b.add_listener(got_b.set)
        a.close()
        s.put("sc.rpc/2", b"10.0.0.2:1")
        assert got_b.wait(10) and wait_until(lambda: sorted(b.values()) == ["10.0.0.1:1", "10.0.0.2:1"], 10)
        assert not got_a.is_set() and a.values() == []
        wait_until(lambda: sorted(x.values()) == ["10.0.0.1:1", "10.0.0.2:1"], 10)
        # a subscriber opened later on the same key joins the shared container, already filled
        with Subscriber(registry, "sc.rpc") as c:
            assert c.container is b.container and sorted(c.values()) == ["10.0.0.1:1", "10.0.0.2:1"]
    finally:
        for sub in (a, b, x):
            sub.close()
