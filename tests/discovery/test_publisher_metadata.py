"""Changing a registration's metadata at runtime: same lease and key, one change for subscribers, the guard
restores the new metadata, and a weight change moves traffic (real etcd, real gRPC servers)."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent import futures

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from waypost.server import serve

ADDR = "127.0.0.1:7001"


def metadata_seen(sub: waypost.Subscriber) -> list[dict]:
    """The metadata of each backend ``sub`` holds, from one read of its list (reading the addresses and then
    the backends apart could see a record go in between)."""
    return [dict(b.metadata) for b in sub.backends()]


class Snapshots:
    """Every backend list a subscriber's listener saw, as (address, metadata) tuples."""

    def __init__(self, sub: waypost.Subscriber) -> None:
        self.sub = sub
        self.lock = threading.Lock()
        self.seen: list[tuple[tuple[str, tuple], ...]] = []
        sub.add_listener(self._on_change)

    def _on_change(self) -> None:
        with self.lock:
            self.seen.append(self.now())

    def now(self) -> tuple[tuple[str, tuple], ...]:
        return tuple((b.address, tuple(sorted(b.metadata.items()))) for b in self.sub.backends())

    def since(self, n: int) -> list[tuple[tuple[str, tuple], ...]]:
        with self.lock:
            return self.seen[n:]


@pytest.mark.parametrize("fmt", ["gozero", "etcd-naming", "kratos"])
def test_update_keeps_lease_and_key_and_subscribers_see_one_change(shared_etcd, unique_key, fmt):
    reg = waypost.connect(shared_etcd.url())
    weight = "7" if fmt == "kratos" else 7  # Kratos metadata is map[string]string
    with waypost.Publisher(reg, unique_key, ADDR, metadata={"weight": 1, "zone": "a"}, format=fmt) as pub, \
            waypost.Subscriber(reg, unique_key, format=fmt) as sub:
        snaps = Snapshots(sub)
        wait_until(lambda: sub.values() == [ADDR], 10)
        lease, key, mark = pub.lease_id, pub.key, len(snaps.since(0))

        pub.update_metadata({"weight": 7, "zone": "a"})
        wait_until(lambda: [m.get("weight") for m in metadata_seen(sub)] == [weight], 10, what="the new weight")
        assert (pub.lease_id, pub.key, pub.registrations) == (lease, key, 1)
        changes = snaps.since(mark)
        assert all(s and s[0][0] == ADDR for s in changes), f"the address went away meanwhile: {changes}"
        assert len(set(changes)) == 1, f"expected one change, saw {changes}"


def test_gozero_metadata_comes_and_goes_in_the_side_record_and_the_guard_restores_the_new_one(shared_etcd,
                                                                                               unique_key):
    reg = waypost.connect(shared_etcd.url())
    side = f"_waypost/meta/{unique_key}/"
    with waypost.Publisher(reg, unique_key, ADDR) as pub, waypost.Subscriber(reg, unique_key) as sub:
        wait_until(lambda: sub.values() == [ADDR], 10)
        assert not reg.sync.get(side, prefix=True).kvs  # no metadata: no side record
        lease = pub.lease_id

        pub.update_metadata({"weight": 3})  # a side record appears, under the same lease
        wait_until(lambda: metadata_seen(sub) == [{"weight": 3}], 10)
        (kv,) = reg.sync.get(side, prefix=True).kvs
        assert kv.lease == lease and b'"weight":3' in kv.value

        pub.update_metadata({"weight": 9})
        reg.sync.delete(side, prefix=True)  # the guard puts back the NEW metadata
        wait_until(lambda: [b'"weight":9' in kv.value for kv in reg.sync.get(side, prefix=True).kvs] == [True], 10,
                   what="the side record restored with weight 9")
        wait_until(lambda: metadata_seen(sub) == [{"weight": 9}], 10)
        reg.sync.delete(unique_key + "/", prefix=True)  # and the address record, with it
        wait_until(lambda: metadata_seen(sub) == [{"weight": 9}], 10)

        pub.update_metadata(None)  # the side record goes; the guard does not bring it back
        wait_until(lambda: metadata_seen(sub) == [{}], 10)
        wait_until(lambda: not reg.sync.get(side, prefix=True).kvs, 10)
        reg.sync.delete(unique_key + "/", prefix=True)  # the guard now watches the address record alone
        wait_until(lambda: sub.values() == [ADDR], 10)
        assert not reg.sync.get(side, prefix=True).kvs
        assert pub.lease_id == lease


def test_bad_metadata_is_refused_with_the_constructors_error(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    bad = {"weight": object()}
    with pytest.raises(TypeError) as at_init:
        waypost.Publisher(reg, unique_key, ADDR, metadata=bad)
    with waypost.Publisher(reg, unique_key, ADDR, metadata={"weight": 1}) as pub:
        with pytest.raises(TypeError) as at_update:
            pub.update_metadata(bad)
        assert str(at_update.value) == str(at_init.value)
        assert pub.metadata == {"weight": 1}  # unchanged


def test_paused_publisher_registers_the_new_metadata_on_resume(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    with waypost.Publisher(reg, unique_key, ADDR, metadata={"weight": 1}) as pub, \
            waypost.Subscriber(reg, unique_key) as sub:
        pub.pause()
        pub.update_metadata({"weight": 4})
        pub.resume()
        wait_until(lambda: metadata_seen(sub) == [{"weight": 4}], 10)


def _echo_server(name: str) -> grpc.Server:
    s = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), s)
    return s


def test_weight_change_moves_traffic_within_a_second(shared_etcd, unique_key):
    kw = {"registry": shared_etcd.url(), "listen_on": "127.0.0.1:0", "grace": 0, "drain_delay": 0}
    a = serve(_echo_server("a"), unique_key, metadata={"weight": 10}, **kw)
    b = serve(_echo_server("b"), unique_key, metadata={"weight": 10}, **kw)
    try:
        target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
        with waypost.dial(target, balancer="smooth_weighted_round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)

            def split() -> Counter:
                return Counter(stub.Unary(echo_pb2.EchoRequest(), timeout=10).server for _ in range(40))

            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20, what="both backends READY")
            assert split() == Counter(a=20, b=20)

            b.update_metadata({"weight": 30})  # now 1:3
            got = wait_until(lambda: (c := split())["b"] in range(28, 33) and c, 1.5,
                             what="the 40 calls split 10:30 after the weight change")
            assert got["a"] + got["b"] == 40
            assert (a.registered_key is not None) and b.publisher.registrations == 1
    finally:
        a.stop()
        b.stop()


def test_async_serve_handle_updates_metadata(shared_etcd, unique_key):
    import asyncio

    reg = waypost.connect(shared_etcd.url())

    async def main() -> None:
        handle = await waypost.serve_async(grpc.aio.server(), unique_key, listen_on="127.0.0.1:0",
                                           registry=reg, metadata={"weight": 1}, grace=0, drain_delay=0)
        try:
            with pytest.raises(TypeError):
                await handle.update_metadata({"weight": object()})
            await handle.update_metadata({"weight": 2})
            kvs = (await asyncio.to_thread(reg.sync.get, f"_waypost/meta/{unique_key}/", prefix=True)).kvs
            assert [b'"weight":2' in kv.value for kv in kvs] == [True]
            assert handle.publisher.registrations == 1
        finally:
            await handle.stop()

    asyncio.run(main())


def test_a_stopped_publisher_with_metadata_is_one_removal(shared_etcd, unique_key):
    """stop() revokes the lease: the address and side records go in one etcd revision, and a subscriber
    applies that as one removal, never first the backend without its metadata (whichever of its two
    watches delivers first)."""
    reg = waypost.connect(shared_etcd.url())
    side = f"_waypost/meta/{unique_key}/"
    with waypost.Subscriber(reg, unique_key) as sub:
        snaps = Snapshots(sub)
        for i in range(8):
            addr = f"127.0.0.1:{7100 + i}"
            pub = waypost.Publisher(reg, unique_key, addr, metadata={"weight": i + 1, "zone": "a"}).start()
            wait_until(lambda addr=addr: sub.values() == [addr], 10)
            assert reg.sync.get(side, prefix=True).kvs  # the side record is there
            mark, before = len(snaps.since(0)), reg.sync.get(unique_key + "/", prefix=True).revision
            pub.stop()
            wait_until(lambda: sub.values() == [], 10, what="the removal")
            assert reg.sync.get(unique_key + "/", prefix=True).revision == before + 1  # one revision
            assert not reg.sync.get(side, prefix=True).kvs
            assert snaps.since(mark) == [()], f"expected one removal, saw {snaps.since(mark)}"
