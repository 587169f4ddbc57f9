"""The fast paths behind the two big-read benchmarks behave exactly like the plain ones.

- ``GetResult.kvs`` of the etcd backend is a lazy sequence: it must look like the list it replaced;
- ``GetResult.value_revisions()`` gives the same mapping with and without the lazy sequence.
"""

from __future__ import annotations

import threading

from waypost.registry.base import GetResult, KeyValue


def _fill(s, key: str) -> None:
    for name, value in (("b", b"2"), ("a", b"1"), ("c", b"3")):
        s.put(f"{key}/{name}", value)


def test_get_kvs_behave_like_a_list(registry, unique_key):
    s = registry.sync
    _fill(s, unique_key)
    res = s.get(unique_key + "/", prefix=True)
    kvs = res.kvs
    assert len(kvs) == 3 and bool(kvs)
    plain = list(kvs)
    assert [kv.key for kv in plain] == [f"{unique_key}/{n}" for n in "abc"]
    assert all(isinstance(kv, KeyValue) for kv in plain)
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


def test_value_revisions_matches_the_kvs(registry, unique_key):
    s = registry.sync
    _fill(s, unique_key)
    s.put(unique_key + "/a", b"1bis")
    res = s.get(unique_key + "/", prefix=True)
    fast = res.value_revisions()  # before any element access: straight from the response
    expected = {kv.key: (kv.value, kv.mod_revision) for kv in res.kvs}
    assert fast == expected and list(fast) == sorted(fast)
    assert res.value_revisions() == expected  # after conversion: from the KeyValues
    assert expected[unique_key + "/a"][1] > expected[unique_key + "/c"][1]
    plain = GetResult(list(res.kvs), res.revision, res.count)
    assert plain.value_revisions() == expected


def test_undecodable_key_bytes_survive_the_lazy_path(registry, unique_key):
    key = unique_key + "/\udcff\udcfe"  # bytes ff fe, kept via surrogateescape
    registry.sync.put(key, b"v")
    res = registry.sync.get(unique_key + "/", prefix=True)
    assert res.value_revisions().keys() == {key}
    assert [kv.key for kv in res.kvs] == [key]


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


def _one_by_one(fmt, records):
    out = []
    for key, value in records:
        entry = fmt.decode(key, value)
        if entry is not None:
            out.append((key, entry))
    return out


def test_gozero_decode_many_matches_decode_on_every_port_spelling():
    from waypost.registry.formats import GOZERO

    ports = [str(p) for p in range(70000)] + ["0" * n + str(p) for n in (1, 2, 4) for p in (0, 1, 80, 6553, 65535)]
    ports += ["", "-1", "+80", "8O80", "\u0668\u0660", "080800", "655350", "99999"]
    records = [(f"k/{i}", f"10.0.0.1:{p}".encode()) for i, p in enumerate(ports)]
    fast = GOZERO.decode_many([k for k, _ in records], [v for _, v in records])
    assert fast == _one_by_one(GOZERO, records)
    assert len(fast) == 65535 + 6  # 1..65535, and 01 080 06553 001 0080 00001 (at most 5 digits)


def test_gozero_decode_many_matches_decode_on_odd_values():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from waypost.registry.formats import GOZERO

    samples = [b"[::1]:443", b"[fe80::1%eth0]:80", b"unix:/tmp/s.sock", b"unix-abstract:x", b"h\xc3\xa9te:1",
               b"\xff\xfe:80", b"host:80 ", b" host:80", b"ho st:80", b"host:80\n", b"a:b:80", b"host/x:80",
               b"x" * 1020 + b":80", b"x" * 1021 + b":80", "\u00e9".encode() * 600 + b":80", b"", b":80",
               b"[]:80", b"[::1]", b"localhost:65535", b"localhost:65536", b"x" * 70000]
    records = [(f"odd/{i}", v) for i, v in enumerate(samples)]
    assert GOZERO.decode_many([k for k, _ in records], [v for _, v in records]) == _one_by_one(GOZERO, records)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.text(max_size=8), st.one_of(
        st.binary(max_size=40),
        st.builds(lambda h, p: f"{h}:{p}".encode("utf-8", "surrogatepass"), st.text(max_size=12),
                  st.text(alphabet="0123456789", max_size=7))))))
    def check(records):
        assert GOZERO.decode_many([k for k, _ in records], [v for _, v in records]) == _one_by_one(GOZERO, records)

    check()


def _both(fmt, records):
    return fmt.decode_many([k for k, _ in records], [v for _, v in records]), _one_by_one(fmt, records)


def test_gozero_decode_many_whole_batch_check_agrees_with_decode():
    from waypost.registry.formats import GOZERO

    ports = [str(p) for p in range(70000)] + ["01", "080", "06553", "00001", "065535", "000080", ""]
    for i, p in enumerate(ports):  # one record a batch: every spelling through the batch check
        fast, slow = _both(GOZERO, [(f"p/{i}", f"10.0.0.1:{p}".encode())])
        assert fast == slow, p
    good = [(f"g/{i}", f"10.{i // 256 % 256}.{i % 256}.1:{1 + i % 65535}".encode()) for i in range(3000)]
    fast, slow = _both(GOZERO, good)
    assert fast == slow and len(fast) == 3000
    for odd in (b"a:80\nb:81", b"a:80\n", b"\nb:80", b"a:80\r", b"x" * 1021 + b":80", b"\xff:80", b"[::1]:80",
                b"unix:/s", b"h:0", b"h:65536", b"h:80\n\n", b""):
        for at in (0, 1500, 2999):
            batch = [*good[:at], ("odd", odd), *good[at:]]
            fast, slow = _both(GOZERO, batch)
            assert fast == slow, (odd, at)


def test_gozero_decode_many_random_batches():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from waypost.registry.formats import GOZERO

    address = st.builds(lambda a, b, p: f"10.{a}.{b}.1:{p}".encode(), st.integers(0, 255), st.integers(0, 255),
                        st.integers(0, 70000))
    odd = st.one_of(st.binary(max_size=20), st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
                    st.builds(lambda h, p: f"{h}:{p}".encode("utf-8", "surrogatepass"), st.text(max_size=8),
                              st.text(alphabet="0123456789\n", max_size=6)))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.one_of(address, address, address, odd), max_size=30))
    def check(values):
        records = [(f"r/{i}", v) for i, v in enumerate(values)]
        fast, slow = _both(GOZERO, records)
        assert fast == slow

    check()


def test_decode_many_needs_parallel_lists():
    import pytest

    from waypost.registry.formats import ETCD_NAMING, GOZERO

    for fmt in (GOZERO, ETCD_NAMING):
        with pytest.raises(ValueError, match="2 keys but 1 values"):
            fmt.decode_many(["a", "b"], [b"h:1"])
    records = [("n/1", b'{"Op":0,"Addr":"h:1","Metadata":null}'), ("n/2", b"junk")]
    assert ETCD_NAMING.decode_many(["n/1", "n/2"], [v for _, v in records]) == _one_by_one(ETCD_NAMING, records)


def _container_state(c):
    return list(c.values()), [(b.address, dict(b.metadata)) for b in c.backends()], c.keys()


def test_container_bulk_fill_equals_adding_one_by_one():
    from types import MappingProxyType

    from waypost.discovery.container import Container
    from waypost.registry.formats import Entry

    md = MappingProxyType({"zone": "a"})
    batches = [
        [(f"k/{i}", Entry(f"10.0.0.{i}:80")) for i in range(50)],  # distinct keys and addresses
        [("k/1", Entry("h:1")), ("k/2", Entry("h:2", md)), ("k/3", Entry("h:1", {"w": 1})), ("k/4", Entry("h:3"))],
        [("k/1", Entry("h:1")), ("k/2", Entry("h:2")), ("k/1", Entry("h:3", md)), ("k/3", Entry("h:2", md))],
        [("k/1", Entry("h:1", {"plain": "dict"}))],
    ]
    for adds in batches:
        bulk = Container()
        calls = []
        bulk.add_listener(lambda calls=calls: calls.append(1))
        assert bulk.apply((), adds) is True and calls == [1]
        one = Container()
        for key, entry in adds:
            one.apply((), [(key, entry)])  # the first one fills an empty container, the rest _add
        assert _container_state(bulk) == _container_state(one), adds
        assert all(isinstance(b.metadata, MappingProxyType) for b in bulk.backends())
        # later changes go through the per-key path and still agree
        for c in (bulk, one):
            c.apply([adds[0][0]], [("k/new", Entry("h:9"))])
        assert _container_state(bulk) == _container_state(one)
    assert Container().apply((), []) is False


def test_container_plain_bulk_load_equals_adding_entries():
    from waypost.discovery.container import Container
    from waypost.registry.formats import Entry

    cases = [
        ([f"k/{i}" for i in range(50)], [f"10.0.0.{i}:80" for i in range(50)]),  # the fast path
        (["k/1", "k/2", "k/3"], ["h:1", "h:2", "h:1"]),  # an address under two keys
        (["k/1", "k/2", "k/1"], ["h:1", "h:2", "h:3"]),  # a key twice
        ([], []),
    ]
    for keys, addresses in cases:
        plain, general = Container(), Container()
        calls = []
        plain.add_listener(lambda calls=calls: calls.append(1))
        changed = plain.bulk_load_plain(list(keys), list(addresses))
        assert changed is bool(keys) and calls == ([1] if keys else [])
        general.apply((), list(zip(keys, map(Entry, addresses))))
        assert _container_state(plain) == _container_state(general), keys
        for c in (plain, general):  # later changes agree too
            c.apply(keys[:1], [("k/new", Entry("h:9"))])
        assert _container_state(plain) == _container_state(general), keys
    # a filled or exclusive container takes the general path
    filled, expected = Container(), Container()
    for c in (filled, expected):
        c.apply((), [("k/0", Entry("h:0"))])
    filled.bulk_load_plain(["k/1"], ["h:1"])
    expected.apply((), [("k/1", Entry("h:1"))])
    assert _container_state(filled) == _container_state(expected)
    excl, expected = Container(exclusive=True), Container(exclusive=True)
    excl.bulk_load_plain(["k/1", "k/2"], ["h:1", "h:1"])
    expected.apply((), [("k/1", Entry("h:1")), ("k/2", Entry("h:1"))])
    assert _container_state(excl) == _container_state(expected) and excl.values() == ("h:1",)


def test_decode_plain_is_decode_many_without_entries():
    from waypost.registry.formats import EtcdNaming, GoZero

    gz = GoZero()
    keys = ["k/1", "k/2"]
    assert gz.decode_plain(keys, [b"10.0.0.1:80", b"[::1]:443"]) == ["10.0.0.1:80", "[::1]:443"]
    assert gz.decode_many(keys, [b"10.0.0.1:80", b"[::1]:443"]) == [
        ("k/1", ("10.0.0.1:80", {})), ("k/2", ("[::1]:443", {}))]
    for odd in ([b"10.0.0.1:80", b"unix:/tmp/s"], [b"h:1", b"h:0"], [b"h:1", b"\xff"], [b"h:1", b"a\nb:1"]):
        assert gz.decode_plain(keys, odd) is None, odd  # the per-record path decides those
    assert EtcdNaming().decode_plain(keys, [b"x", b"y"]) is None  # no fast path: JSON records


def test_key_columns_match_the_kvs(registry, unique_key):
    s = registry.sync
    _fill(s, unique_key)
    res = s.get(unique_key + "/", prefix=True)
    cols = res.key_columns()  # before any element access: from the response
    expected = ([kv.key for kv in res.kvs], [kv.value for kv in res.kvs], [kv.mod_revision for kv in res.kvs])
    assert cols == expected and res.key_columns() == expected
    assert GetResult(list(res.kvs), res.revision).key_columns() == expected


def test_a_big_load_keeps_columns_until_the_raw_records_are_needed(registry, unique_key):
    from tests.waiting import wait_until
    from waypost.discovery import Subscriber

    s = registry.sync
    for i in range(30):
        s.put(f"{unique_key}/{i:02d}", f"10.0.0.{i}:80".encode())
    with Subscriber(registry, unique_key) as sub:
        group = sub._group
        assert group is not None and group.main._columns is not None  # nothing built per record yet
        assert len(sub.values()) == 30
        s.put(f"{unique_key}/05", b"10.0.9.9:80")  # a change needs the raw records: built then
        assert wait_until(lambda: "10.0.9.9:80" in sub.values() and "10.0.0.5:80" not in sub.values(), 10)
        assert group.main._columns is None and len(group.main.raw) == 30
        assert group.main.raw[f"{unique_key}/05"][0] == b"10.0.9.9:80"
