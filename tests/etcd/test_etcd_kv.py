"""waypost's etcd client against a real etcd: proto subset, KV, leases, endpoints."""

from __future__ import annotations

import time

import pytest

from tests.etcd.helpers import on_loop, registry, run
from waypost.errors import LeaseNotFound, RegistryError, RegistryUnavailable
from waypost.etcd import _methods
from waypost.etcd._generated import waypost_etcd_pb2 as pb
from waypost.etcd.keys import decode_key, encode_key, key_range, prefix_range_end
from waypost.etcd.local import free_port


def test_prefix_range_end_follows_etcds_rule():
    assert prefix_range_end(b"a") == b"b"
    assert prefix_range_end(b"greet.rpc/") == b"greet.rpc0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"a\xff\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"
    assert key_range("", True) == (b"\0", b"\0")
    assert key_range("k", False) == (b"k", b"")


def test_keys_round_trip_undecodable_bytes():
    raw = b"svc/\xff\xfe"
    assert encode_key(decode_key(raw)) == raw
    assert encode_key("caf\u00e9") == "caf\u00e9".encode()


def test_proto_package_is_private_but_paths_are_etcds():
    assert pb.DESCRIPTOR.package == "waypost.etcdpb"
    assert pb.RangeRequest.DESCRIPTOR.full_name == "waypost.etcdpb.RangeRequest"
    paths = [v for k, v in vars(_methods).items() if k.isupper()]
    assert paths and all(p.startswith("/etcdserverpb.") for p in paths)
    assert _methods.RANGE == "/etcdserverpb.KV/Range"
    assert _methods.LEASE_KEEPALIVE == "/etcdserverpb.Lease/LeaseKeepAlive"
    assert _methods.WATCH == "/etcdserverpb.Watch/Watch"
    # etcd's field numbers (a sample from rpc.proto / kv.proto)
    f = pb.WatchResponse.DESCRIPTOR.fields_by_name
    assert (f["compact_revision"].number, f["cancel_reason"].number, f["fragment"].number,
            f["events"].number) == (5, 6, 7, 11)
    assert pb.Compare.DESCRIPTOR.fields_by_name["range_end"].number == 64
    assert pb.KeyValue.DESCRIPTOR.fields_by_name["lease"].number == 6


def test_kv_prefix_revisions_keys_only_count_limit(shared_etcd, unique_key):
    p = unique_key + "/"
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        r1 = s.put(p + "a", b"1").revision
        r2 = s.put(p + "b", b"2").revision
        s.put(p + "c", b"3")
        s.put(unique_key + "x", b"not under the prefix")
        got = s.get(p, prefix=True)
        assert [(kv.key, kv.value) for kv in got.kvs] == [(p + "a", b"1"), (p + "b", b"2"), (p + "c", b"3")]
        assert got.count == 3
        assert s.get(p, prefix=True, revision=r1).kvs[0].key == p + "a"
        assert [kv.key for kv in s.get(p, prefix=True, revision=r2).kvs] == [p + "a", p + "b"]
        ko = s.get(p, prefix=True, keys_only=True)
        assert [kv.value for kv in ko.kvs] == [b"", b"", b""] and ko.count == 3
        co = s.get(p, prefix=True, count_only=True)
        assert co.kvs == [] and co.count == 3
        lim = s.get(p, prefix=True, limit=2)
        assert [kv.key for kv in lim.kvs] == [p + "a", p + "b"] and lim.count == 3
        assert s.get(p + "zzz").kvs == []


def test_put_and_delete_prev_kv_and_versions(shared_etcd, unique_key):
    k = unique_key + "/k"
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        first = s.put(k, b"one")
        second = s.put(k, b"two", prev_kv=True)
        assert second.prev_kv is not None and second.prev_kv.value == b"one"
        kv = s.get(k).kvs[0]
        assert (kv.create_revision, kv.mod_revision, kv.version) == (first.revision, second.revision, 2)
        d = s.delete(unique_key + "/", prefix=True, prev_kv=True)
        assert d.deleted == 1 and [p.value for p in d.prev_kvs] == [b"two"]
        assert d.revision == second.revision + 1


def test_undecodable_key_round_trips_through_etcd(shared_etcd, unique_key):
    key = decode_key(encode_key(unique_key) + b"/\xff\xfe")
    with registry(shared_etcd.endpoint) as reg:
        reg.sync.put(key, b"v")
        (kv,) = reg.sync.get(unique_key + "/", prefix=True).kvs
        assert kv.key == key and encode_key(kv.key).endswith(b"\xff\xfe")


def test_txn_put_if_absent(shared_etcd, unique_key):
    k = (unique_key + "/lock").encode()
    with registry(shared_etcd.endpoint) as reg:
        client = on_loop(lambda: reg.client)
        assert run(client.put_if_absent(k, b"me")).succeeded is True
        again = run(client.put_if_absent(k, b"you"))
        assert again.succeeded is False
        assert reg.sync.get(k.decode()).kvs[0].value == b"me"
        # compare on mod_revision: succeeds only for the current one
        mod = reg.sync.get(k.decode()).kvs[0].mod_revision
        cmp = pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.EQUAL, mod_revision=mod)
        op = pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"next"))
        assert run(client.txn([cmp], [op])).succeeded is True
        assert run(client.txn([cmp], [op])).succeeded is False


def test_lease_grant_ttl_revoke_and_unknown_lease(shared_etcd, unique_key):
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        lease = s.grant(30)
        assert 0 < s.time_to_live(lease) <= 30
        s.put(unique_key + "/l", b"v", lease=lease)
        assert s.get(unique_key + "/l").kvs[0].lease == lease
        s.revoke(lease)
        assert s.get(unique_key + "/l").kvs == []
        assert s.time_to_live(lease) == -1
        with pytest.raises(LeaseNotFound, match="put"):
            s.put(unique_key + "/l", b"v", lease=lease)


def test_bad_request_is_a_registry_error_naming_the_operation(shared_etcd):
    with registry(shared_etcd.endpoint) as reg, pytest.raises(RegistryError, match="etcd get"):
        reg.sync.get("x", revision=10**12)  # a future revision


def test_one_keepalive_stream_for_many_leases(shared_etcd, unique_key):
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        leases = [s.grant(2) for _ in range(5)]
        lost: list[int] = []
        handles = on_loop(lambda: [reg.keep_alive(lid, 2, lambda i, _r: lost.append(i)) for lid in leases])
        try:
            mgr = reg.client.leases
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not all(
                    st.renewed >= 3 for st in mgr._leases.values()):
                time.sleep(0.1)
            assert len(mgr._leases) == 5 and all(st.renewed >= 3 for st in mgr._leases.values())
            assert mgr.connects == 1
            assert all(s.time_to_live(lid) > 0 for lid in leases) and lost == []
        finally:
            for h in handles:
                h.cancel()


def test_unreachable_endpoint_raises_within_dial_timeout():
    dead = f"127.0.0.1:{free_port()}"
    with registry(dead, dial_timeout=1.0) as reg:
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="etcd get") as e:
            reg.sync.get("k")
        elapsed = time.monotonic() - t0
        assert dead in str(e.value)
        assert elapsed < 1.0 + 4.0, f"took {elapsed:.1f}s with dial_timeout=1"


def test_dead_endpoint_in_list_is_skipped_and_hostnames_work(shared_etcd, unique_key):
    dead = f"127.0.0.1:{free_port()}"
    live = f"localhost:{shared_etcd.members[0].client_port}"
    with registry([dead, live]) as reg:
        reg.sync.put(unique_key + "/h", b"v")
        assert reg.sync.get(unique_key + "/h").kvs[0].value == b"v"
