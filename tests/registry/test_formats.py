"""Wire formats: exact bytes, round trips, and decode never raising on garbage."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waypost.discovery.formats import (
    ETCD_NAMING,
    FORMATS,
    GOZERO,
    KRATOS,
    MAX_VALUE_BYTES,
    Entry,
    get_format,
    valid_address,
)


def test_gozero_exact_bytes():
    assert GOZERO.encode("greet.rpc", "10.0.0.5:8080", 7587844881234567890) == (
        "greet.rpc/7587844881234567890", b"10.0.0.5:8080",
    )
    assert GOZERO.encode("greet.rpc", "10.0.0.5:8080", "custom") == ("greet.rpc/custom", b"10.0.0.5:8080")
    assert GOZERO.encode_side("greet.rpc", "10.0.0.5:8080", 12) == []
    assert GOZERO.encode_side("greet.rpc", "10.0.0.5:8080", 12, {"zone": "b", "weight": 20}) == [
        ("_waypost/meta/greet.rpc/12", b'{"addr":"10.0.0.5:8080","metadata":{"weight":20,"zone":"b"}}'),
    ]
    assert GOZERO.prefix("greet.rpc") == "greet.rpc/"
    assert GOZERO.prefix("greet.rpc", exact=True) == "greet.rpc"


def test_gozero_side_record_round_trip():
    (k, v), = GOZERO.encode_side("s", "1.2.3.4:5", 99, {"weight": 3})
    meta = GOZERO.decode_side(k, v, GOZERO.side_prefix("s"))
    assert meta is not None and (meta.id, meta.address, dict(meta.metadata)) == ("99", "1.2.3.4:5", {"weight": 3})
    assert GOZERO.join_id("s/99", "s/") == "99"


def test_etcd_naming_exact_bytes():
    assert ETCD_NAMING.encode("greet", "1.2.3.4:50051") == (
        "greet/1.2.3.4:50051", b'{"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}',
    )
    assert ETCD_NAMING.encode("greet", "1.2.3.4:50051", 0, {"z": 1, "a": "<x>"})[1] == (
        b'{"Op":0,"Addr":"1.2.3.4:50051","Metadata":{"a":"\\u003cx\\u003e","z":1}}'
    )
    e = ETCD_NAMING.decode("greet/1.2.3.4:50051", b'{"Op":0,"Addr":"1.2.3.4:50051","Metadata":{"w":2}}')
    assert e == Entry("1.2.3.4:50051", {"w": 2})
    # Go matches field names case-insensitively; a non-object Metadata is dropped, not fatal
    assert ETCD_NAMING.decode("k/x", b'{"addr":"1.2.3.4:1","metadata":"s"}') == Entry("1.2.3.4:1")


def test_kratos_exact_bytes_and_decode():
    key, value = KRATOS.encode("helloworld", "10.0.0.1:9000", "inst-1", {"version": "v1.2", "weight": 20})
    assert key == "/microservices/helloworld/inst-1"
    assert value == (
        b'{"id":"inst-1","name":"helloworld","version":"v1.2","metadata":{"weight":"20"},'
        b'"endpoints":["grpc://10.0.0.1:9000"]}'
    )
    assert KRATOS.decode(key, value) == Entry("10.0.0.1:9000", {"weight": "20", "version": "v1.2"})
    assert KRATOS.encode("svc", "1.1.1.1:1", 5)[1] == (
        b'{"id":"5","name":"svc","version":"","metadata":null,"endpoints":["grpc://1.1.1.1:1"]}'
    )
    # what a Kratos server writes: http first, grpc second with a query
    go = json.dumps({
        "id": "x", "name": "svc", "version": "", "metadata": None,
        "endpoints": ["http://10.0.0.2:8000?isSecure=false", "grpc://10.0.0.2:9000?isSecure=false"],
    }).encode()
    assert KRATOS.decode("/microservices/svc/x", go) == Entry("10.0.0.2:9000")
    # only http: nothing to dial
    only_http = json.dumps({"id": "x", "name": "svc", "endpoints": ["http://10.0.0.2:8000"]}).encode()
    assert KRATOS.decode("/microservices/svc/x", only_http) is None
    # another service's name under our prefix is skipped, as Kratos does
    other = json.dumps({"id": "x", "name": "other", "endpoints": ["grpc://1.1.1.1:1"]}).encode()
    assert KRATOS.decode("/microservices/svc/x", other) is None
    assert KRATOS.prefix("svc") == "/microservices/svc/"


@pytest.mark.parametrize(
    "value",
    [b"", b"not an address", b"1.2.3.4", b"1.2.3.4:0", b"1.2.3.4:70000", b"host:12a", b"\xff\xfe:80",
     b"a b:80", b"[::1:80", b"x" * (MAX_VALUE_BYTES + 1)],
)
def test_gozero_rejects_bad_values(value):
    assert GOZERO.decode("k/1", value) is None


@pytest.mark.parametrize(
    "value",
    [b"[]", b"null", b"{", b'{"Addr":5}', b'{"Addr":"1.2.3.4:1","Op":"0"}', b'{"Op":0}',
     b'{"Addr":"1.2.3.4:1","Op":true}', b'{"Addr":"bad"}'],
)
def test_etcd_naming_rejects_wrong_types(value):
    assert ETCD_NAMING.decode("k/1", value) is None


@pytest.mark.parametrize(
    "value",
    [b'{"endpoints":"grpc://1.1.1.1:1"}', b'{"endpoints":[1]}', b'{"id":1,"endpoints":["grpc://1.1.1.1:1"]}',
     b'{"metadata":{"a":1},"endpoints":["grpc://1.1.1.1:1"]}', b'{"endpoints":["grpc://nope"]}'],
)
def test_kratos_rejects_wrong_types(value):
    assert KRATOS.decode("/microservices/s/1", value) is None


def test_bad_key_logged_once(caplog):
    caplog.set_level(logging.DEBUG, logger="waypost.discovery.formats")
    for _ in range(5):
        assert GOZERO.decode("once/1", b"garbage") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "once/1" in r.getMessage()]
    assert len(warnings) == 1
    # a good value resets it: the next bad value is reported again
    assert GOZERO.decode("once/1", b"1.2.3.4:80") == Entry("1.2.3.4:80")
    assert GOZERO.decode("once/1", b"garbage") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "once/1" in r.getMessage()]
    assert len(warnings) == 2


def test_encode_rejects_bad_input_with_a_clear_error():
    with pytest.raises(ValueError, match="address"):
        GOZERO.encode("k", "no-port", 1)
    with pytest.raises(ValueError, match="id"):
        GOZERO.encode("k", "1.2.3.4:1", "a/b")
    with pytest.raises(ValueError, match="key"):
        ETCD_NAMING.encode("", "1.2.3.4:1")
    with pytest.raises(ValueError, match="known formats: etcd-naming, gozero, kratos"):
        get_format("zookeeper")


def test_valid_address():
    for ok in ["1.2.3.4:1", "[::1]:80", "host.example:65535", "unix:/tmp/s.sock"]:
        assert valid_address(ok), ok
    for bad in ["", ":80", "h:", "h:0", "[::1:80", "h h:80", "a:b:80", "h:+80"]:
        assert not valid_address(bad), bad


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    value=st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(st.sampled_from(["Op", "Addr", "Metadata", "id", "name", "version", "metadata",
                                         "endpoints", "addr"]), json_values, max_size=6)
        .map(lambda v: json.dumps(v).encode()),
        st.integers(MAX_VALUE_BYTES - 2, MAX_VALUE_BYTES + 10).map(lambda n: b"1" * n),
    ),
)
def test_decode_fuzz_never_raises(fmt, value):
    f = get_format(fmt)
    out = f.decode(f.prefix("svc") + "k", value)
    assert out is None or (isinstance(out, Entry) and valid_address(out.address))
    side = f.side_prefix("svc")
    if side is not None:
        m = f.decode_side(side + "k", value, side)
        assert m is None or isinstance(m.address, str)


@settings(max_examples=100, deadline=None)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    host=st.from_regex(r"\A[a-z][a-z0-9.-]{0,20}\Z"),
    port=st.integers(1, 65535),
    md=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda s: s != "version"),
                       st.text(max_size=10), max_size=3),
    ident=st.integers(1, 2**63 - 1),
)
def test_round_trip(fmt, host, port, md, ident):
    f = get_format(fmt)
    addr = f"{host}:{port}"
    key, value = f.encode("svc", addr, ident, md)
    assert key.startswith(f.prefix("svc"))
    entry = f.decode(key, value)
    assert entry is not None and entry.address == addr
    if fmt == "gozero":
        for k, v in f.encode_side("svc", addr, ident, md):
            meta = f.decode_side(k, v, f.side_prefix("svc"))
            assert meta is not None and dict(meta.metadata) == md and meta.id == str(ident)
    else:
        assert dict(entry.metadata) == md


_fuzz_names = iter(range(10**9))


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    records=st.lists(
        st.one_of(
            st.integers(1, 65535).map(lambda p: ("good", p)),
            st.binary(max_size=80).map(lambda b: ("bad", b)),
            json_values.map(lambda v: ("bad", json.dumps(v).encode())),
        ),
        max_size=12,
    ),
)
def test_subscriber_keeps_every_good_record_next_to_garbage(fmt, records):
    """Through a real Subscriber (memory registry): garbage never hides a good record, never raises."""
    from waypost.discovery import Subscriber
    from waypost.registries.memory.store import MemoryRegistry

    name = f"fuzz-{next(_fuzz_names)}"
    reg = MemoryRegistry(name)
    f = get_format(fmt)
    want = set()
    try:
        for i, (kind, payload) in enumerate(records):
            if kind == "good":
                addr = f"10.0.0.{i}:{payload}"
                key, value = f.encode("svc", addr, f"id{i}", None)
                want.add(addr)
            else:
                key, value = f.prefix("svc") + f"id{i}", payload
                out = f.decode(key, value)
                if out is not None:  # random bytes can happen to be a valid record
                    want.add(out.address)
            reg.sync.put(key, value)
        with Subscriber(reg, "svc", format=fmt) as sub:
            assert set(sub.values()) == want
    finally:
        MemoryRegistry.drop(name)


# -- decode_many: the per-record checks of decode, inlined for a big read, give the same entries --


def _one_by_one(fmt, records):
    out = []
    for key, value in records:
        entry = fmt.decode(key, value)
        if entry is not None:
            out.append((key, entry))
    return out


def test_gozero_decode_many_matches_decode_on_every_port_spelling():
    from waypost.discovery.formats import GOZERO

    ports = [str(p) for p in range(70000)] + ["0" * n + str(p) for n in (1, 2, 4) for p in (0, 1, 80, 6553, 65535)]
    ports += ["", "-1", "+80", "8O80", "\u0668\u0660", "080800", "655350", "99999"]
    records = [(f"k/{i}", f"10.0.0.1:{p}".encode()) for i, p in enumerate(ports)]
    fast = GOZERO.decode_many([k for k, _ in records], [v for _, v in records])
    assert fast == _one_by_one(GOZERO, records)
    assert len(fast) == 65535 + 6  # 1..65535, and 01 080 06553 001 0080 00001 (at most 5 digits)


def test_gozero_decode_many_matches_decode_on_odd_values():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from waypost.discovery.formats import GOZERO

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


def test_gozero_decode_many_random_batches():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from waypost.discovery.formats import GOZERO

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

    from waypost.discovery.formats import ETCD_NAMING, GOZERO

    for fmt in (GOZERO, ETCD_NAMING):
        with pytest.raises(ValueError, match="2 keys but 1 values"):
            fmt.decode_many(["a", "b"], [b"h:1"])
    records = [("n/1", b'{"Op":0,"Addr":"h:1","Metadata":null}'), ("n/2", b"junk")]
    assert ETCD_NAMING.decode_many(["n/1", "n/2"], [v for _, v in records]) == _one_by_one(ETCD_NAMING, records)


def test_gozero_decode_many_whole_batch_check_agrees_with_decode():
    from waypost.discovery.formats import GOZERO

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


def test_decode_plain_is_decode_many_without_entries():
    from waypost.discovery.formats import EtcdNaming, GoZero

    gz = GoZero()
    keys = ["k/1", "k/2"]
    assert gz.decode_plain(keys, [b"10.0.0.1:80", b"[::1]:443"]) == ["10.0.0.1:80", "[::1]:443"]
    assert gz.decode_many(keys, [b"10.0.0.1:80", b"[::1]:443"]) == [
        ("k/1", ("10.0.0.1:80", {})), ("k/2", ("[::1]:443", {}))]
    for odd in ([b"10.0.0.1:80", b"unix:/tmp/s"], [b"h:1", b"h:0"], [b"h:1", b"\xff"], [b"h:1", b"a\nb:1"]):
        assert gz.decode_plain(keys, odd) is None, odd  # the per-record path decides those
    assert EtcdNaming().decode_plain(keys, [b"x", b"y"]) is None  # no fast path: JSON records
