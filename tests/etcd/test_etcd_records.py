"""Range records read as columns (etcd/records.py) and KeyValues built from them (registry/etcd.py).

The column reader must give exactly what one protobuf message per record gives: the fuzz test compares
them on random responses (keys that are not UTF-8, empty values, zero or huge revisions and leases,
fields present on only some records), and the real-etcd test checks that etcd's own encoding lines up
the way the column reader assumes (and falls back when it does not).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.etcd.helpers import registry, run
from waypost.discovery.store import GetResult, KeyValue
from waypost.errors import RegistryError
from waypost.etcd import records
from waypost.etcd._generated import waypost_etcd_pb2 as pb
from waypost.etcd.keys import key_range
from waypost.registries.etcd.store import _LazyKeyValues

FUZZ = settings(max_examples=int(os.environ.get("WAYPOST_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

NONZERO = st.one_of(st.integers(1, 10**6), st.integers(1, 2**63 - 1), st.integers(-(2**63), -1))
INT64 = st.one_of(st.just(0), NONZERO)
KEYS = st.one_of(st.binary(min_size=1, max_size=12),  # often not UTF-8
                 st.text(min_size=1, max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")))


@st.composite
def responses(draw: st.DrawFn) -> pb.RangeResponse:
    """A RangeResponse whose fields are on every record, on none, or on some (per field)."""
    n = draw(st.integers(0, 12))
    kvs = []
    modes = {f: draw(st.sampled_from(["all", "none", "any"])) for f in
             ("key", "value", "create_revision", "mod_revision", "version", "lease")}

    def pick(field: str, present: st.SearchStrategy, zero: object) -> object:
        mode = modes[field]
        if mode == "none":
            return zero
        value = draw(present if mode == "all" else st.one_of(st.just(zero), present))
        return value

    for _ in range(n):
        kvs.append(pb.KeyValue(
            key=pick("key", KEYS, b""), value=pick("value", st.binary(min_size=1, max_size=20), b""),
            create_revision=pick("create_revision", NONZERO, 0), mod_revision=pick("mod_revision", NONZERO, 0),
            version=pick("version", NONZERO, 0), lease=pick("lease", NONZERO, 0)))
    return pb.RangeResponse(header=pb.ResponseHeader(revision=draw(INT64), cluster_id=7), kvs=kvs,
                            count=n + draw(st.integers(0, 3)), more=draw(st.booleans()))


def _kv_plain(m: pb.KeyValue) -> KeyValue:
    """The KeyValue one message stands for, field by field."""
    return KeyValue(m.key.decode("utf-8", "surrogateescape"), m.value, m.create_revision, m.mod_revision,
                    m.version, m.lease)


def _lines_up(kvs: list[pb.KeyValue]) -> bool:
    always = all(m.key and m.create_revision and m.mod_revision and m.version for m in kvs)
    return always and all(len({bool(getattr(m, f)) for m in kvs}) <= 1 for f in ("value", "lease"))


@FUZZ
@given(responses())
def test_columns_give_what_one_message_per_record_gives(resp):
    data = resp.SerializeToString()
    expected = [_kv_plain(m) for m in resp.kvs]
    assert records.head(data) == (resp.header.revision, resp.count, len(resp.kvs))
    cols = records.columns(data, len(resp.kvs))
    assert (cols is not None) == _lines_up(list(resp.kvs))
    if cols is not None:
        assert list(zip(*cols)) == [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
                                    for kv in expected]
    lazy = _LazyKeyValues(data, len(resp.kvs))
    assert len(lazy) == len(expected)
    assert list(lazy) == expected and all(type(kv) is KeyValue for kv in lazy)
    assert [hash(kv) for kv in lazy] == [hash(kv) for kv in expected] and repr(lazy) == repr(expected)


def test_malformed_range_response_is_a_registry_error():
    with pytest.raises(RegistryError, match="malformed Range response"):
        records.head(b"\x12\xff")  # a record longer than the message
    data = b"\x12\x02\x0a\xff"  # framing fine, the record itself cut short
    assert records.head(data).records == 1
    with pytest.raises(RegistryError, match="malformed Range response"):
        records.columns(data, 1)
    with pytest.raises(RegistryError, match="malformed Range response"):
        records.messages(data)


def test_real_etcd_records_line_up_and_mixed_ones_fall_back(shared_etcd, unique_key):
    """etcd's own encoding: uniform prefixes read as columns, mixed ones one message at a time."""
    with registry(shared_etcd.endpoint) as reg:
        s = reg.sync
        lease = s.grant(60)
        for i in range(5):
            s.put(f"{unique_key}/leased/{i}", f"10.0.0.{i}:80".encode(), lease=lease)
        s.put(f"{unique_key}/plain/a", b"x")
        s.put(f"{unique_key}/plain/b\udcff", b"y")
        s.put(f"{unique_key}/mixed/a", b"x", lease=lease)
        s.put(f"{unique_key}/mixed/b", b"")
        s.put(f"{unique_key}/mixed/c", b"z")

        def serialized(prefix: str, **kw) -> bytes:
            k, end = key_range(f"{unique_key}/{prefix}", True)
            return run(reg.client.range_serialized(k, end, **kw))

        for prefix, lines_up in (("leased/", True), ("plain/", True), ("mixed/", False), ("none/", True)):
            data = serialized(prefix)
            resp = pb.RangeResponse.FromString(data)
            n = records.head(data).records
            assert n == len(resp.kvs)
            assert (records.columns(data, n) is not None) is lines_up, prefix
            got = s.get(f"{unique_key}/{prefix}", prefix=True)
            assert list(got.kvs) == [_kv_plain(m) for m in resp.kvs]
            vals = s.get_values(f"{unique_key}/{prefix}", prefix=True)
            assert (vals.keys, vals.values, vals.mod_revisions) == (
                [kv.key for kv in got.kvs], [kv.value for kv in got.kvs], [kv.mod_revision for kv in got.kvs])
        assert [kv.lease for kv in s.get(f"{unique_key}/mixed/", prefix=True).kvs] == [lease, 0, 0]
        assert s.get(f"{unique_key}/plain/", prefix=True).kvs[1].key == f"{unique_key}/plain/b\udcff"

        data = serialized("leased/", keys_only=True)  # no values at all: an empty value column lines up
        assert records.columns(data, records.head(data).records) is not None
        data = serialized("", keys_only=True)  # ... but the leases here are mixed
        assert records.columns(data, records.head(data).records) is None
        only = s.get(f"{unique_key}/", prefix=True, keys_only=True)
        assert len(only.kvs) == 10 and {kv.value for kv in only.kvs} == {b""}
        limited = s.get(f"{unique_key}/", prefix=True, limit=3)
        assert (len(limited.kvs), limited.count) == (3, 10)
        assert isinstance(limited, GetResult) and limited.kvs[2].key == f"{unique_key}/leased/2"
        s.revoke(lease)


def test_keyvalues_built_from_columns_are_frozen_keyvalues():
    import dataclasses

    from waypost.registries.etcd.store import _keyvalues

    cols = records.Columns(["svc/\udcff", "svc/b"], [b"10.0.0.1:80", b""], [3, 4], [9, 5], [2, 1], [-(2**63), 0])
    built = _keyvalues(cols)
    assert built == list(map(KeyValue, *cols)) and all(type(kv) is KeyValue for kv in built)
    assert [hash(kv) for kv in built] == [hash(KeyValue(*row)) for row in zip(*cols)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].key = "x"  # type: ignore[misc]
    assert not hasattr(built[0], "__dict__")
