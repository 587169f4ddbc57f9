"""Fuzzing the registry side (hypothesis): registry URLs through ``connect``, and registry values of every wire
format arriving on the WATCH path of a live Subscriber (memory registry): puts, value changes and deletes in
random order, mixing good records with random bytes, non-UTF-8, huge values and wrong JSON types.

What must hold: only ``InvalidTarget`` from a bad URL, with no password in it; the subscriber always holds
exactly the addresses of the currently valid records (a bad value never hides a good one next to it, a
value changed to garbage drops that record, a value changed back restores it); the control loop survives.
The parsers' own fuzz tests are in test_fuzz_parsers.py (targets, configs) and test_formats.py (decode,
initial load next to garbage).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import string
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import waypost
from waypost import _loop
from waypost.discovery import Subscriber
from waypost.discovery.formats import FORMATS, MAX_VALUE_BYTES, get_format
from waypost.registries.memory.store import MemoryRegistry

FUZZ = settings(max_examples=int(os.environ.get("WAYPOST_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
_names = itertools.count()

# ---- registry URLs -------------------------------------------------------------------------------

URL_PARTS = st.sampled_from([
    "etcd://", "memory://", "ETCD://", "http://", "etcd:", "//", "/", "u:p@", "user:S3cr3t-pw@", ":S3cr3t-pw@", "@",
    "127.0.0.1", ":2379", ":0", ":99999", "[::1]", "[::1", "h1", ",", "?", "&", "=", "tls=1", "tls=maybe", "ca=",
    "ca=/nonexistent.pem", "cert=/x", "key=/y", "dial_timeout=1", "dial_timeout=-1", "dial_timeout=nan",
    "request_timeout=1e9", "bogus=1", "%", "%2F", "%zz", "#", " ", "\x00", "é", "name",
])


def _check_url(url: str) -> None:
    try:
        reg = waypost.connect(url)
    except waypost.InvalidTarget as e:
        text = str(e)
        assert text
        assert "S3cr3t-pw" not in text, text
        return
    if isinstance(reg, MemoryRegistry):  # a memory registry's name is free text, no credentials
        return
    # a valid URL gives a registry without touching the network; its repr hides the password
    assert "S3cr3t-pw" not in repr(reg)
    _loop.run(reg.close(), 10)


@FUZZ
@given(st.lists(URL_PARTS, max_size=10).map("".join))
def test_assembled_registry_urls(url):
    _check_url(url)


@FUZZ
@given(st.text(alphabet=string.printable + "é\x00", max_size=60))
def test_arbitrary_registry_urls(url):
    _check_url(url)


@FUZZ
@given(st.text(alphabet=string.ascii_letters + string.digits + "!$'()*+,;=-._~:/?#[]@%", min_size=1, max_size=16))
def test_registry_url_passwords_never_shown(password):
    for url in (f"etcd://root:{password}@127.0.0.1:2379", f"etcd://root:{quote(password, safe='')}@127.0.0.1:0",
                f"etcd://root:{quote(password, safe='')}@127.0.0.1:2379?bogus=1"):
        try:
            reg = waypost.connect(url)
        except waypost.InvalidTarget as e:
            assert f":{password}@" not in str(e) and f":{quote(password, safe='')}@" not in str(e)
            continue
        shown = repr(reg) + str(getattr(reg, "url", ""))
        assert f":{password}@" not in shown and f":{quote(password, safe='')}@" not in shown
        _loop.run(reg.close(), 10)


# ---- values on the watch path --------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["Op", "Addr", "Metadata", "id", "name", "version", "metadata", "endpoints", "x"]), c,
        max_size=5),
    max_leaves=10,
)
BAD_VALUES = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=1, max_size=8).map(lambda b: b"\xff\xfe" + b),  # never UTF-8
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.integers(MAX_VALUE_BYTES - 1, MAX_VALUE_BYTES + 64).map(lambda n: b"1" * n),
    st.just(b""),
)
# an operation on one of 6 record ids: put a good address, put a bad value, or delete
OPS = st.lists(
    st.tuples(st.integers(0, 5), st.one_of(
        st.integers(1, 65535).map(lambda p: ("good", p)),
        BAD_VALUES.map(lambda b: ("bad", b)),
        st.just(("delete", None)),
    )),
    min_size=1, max_size=16,
)


@settings(max_examples=int(os.environ.get("WAYPOST_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(FORMATS)), initial=OPS, later=OPS)
def test_watch_path_tracks_exactly_the_valid_records(fmt, initial, later):
    name = f"fuzzw-{next(_names)}"
    reg = MemoryRegistry(name)
    f = get_format(fmt)
    model: dict[str, str] = {}  # record key -> address it decodes to (valid records only)

    def apply(ops) -> None:
        for ident, (kind, payload) in ops:
            key = f.prefix("svc") + f"id{ident}"
            if kind == "delete":
                reg.sync.delete(key)
                model.pop(key, None)
                continue
            if kind == "good":
                addr = f"10.1.{ident}.1:{payload}"
                key, value = f.encode("svc", addr, f"id{ident}", None)
            else:
                value = payload
            reg.sync.put(key, value)
            out = f.decode(key, value)  # random bytes can happen to be a valid record
            if out is None:
                model.pop(key, None)
            else:
                model[key] = out.address

    try:
        apply(initial)
        fired = []
        with Subscriber(reg, "svc", format=fmt) as sub:
            assert set(sub.values()) == set(model.values())

            def boom() -> None:
                fired.append(1)
                raise RuntimeError("a listener that always fails must not stop updates")

            sub.add_listener(boom)
            apply(later)
            want = set(model.values())
            # the memory registry delivers synchronously through the control loop: wait for it to drain
            _loop.run(asyncio.sleep(0.01), 10)
            deadline = 200
            while set(sub.values()) != want and deadline:
                _loop.run(asyncio.sleep(0.01), 10)
                deadline -= 1
            assert set(sub.values()) == want
        # the control loop is alive and serves new work
        assert _loop.run(asyncio.sleep(0, result="alive"), 10) == "alive"
    finally:
        MemoryRegistry.drop(name)
