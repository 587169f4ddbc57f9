"""An operator's weight override (``_waypost/override/<key>/<address>``) reaches the publisher's registration and
survives its guard; deleting it restores the publisher's own metadata (real etcd and the memory registry)."""

from __future__ import annotations

import time

import pytest

import waypost
from harness.waiting import wait_until
from waypost.discovery.formats import get_format
from waypost.discovery.override import (
    apply_override,
    encode_override,
    override_key,
    parse_override,
    split_override_key,
)

ADDR = "127.0.0.1:7301"


def _meta(sub: waypost.Subscriber) -> dict | None:
    got = {b.address: dict(b.metadata) for b in sub.backends()}
    return got.get(ADDR)


@pytest.mark.parametrize("fmt", ["gozero", "etcd-naming", "kratos"])
def test_override_applies_survives_the_guard_and_goes(registry, unique_key, fmt):
    sync = registry.sync
    weight = "20" if fmt == "kratos" else 20  # Kratos metadata carries strings
    zero = "0" if fmt == "kratos" else 0
    with waypost.Publisher(registry, unique_key, ADDR, ttl=5, metadata={"weight": 20, "zone": "a"}, format=fmt) as pub, \
            waypost.Subscriber(registry, unique_key, format=fmt, timeout=10) as sub:
        wait_until(lambda: (_meta(sub) or {}).get("weight") == weight, 10)
        sync.put(override_key(unique_key, ADDR), encode_override(0, "127.0.0.1", time.time()))
        wait_until(lambda: _meta(sub) == {"weight": zero, "zone": "a"}, 10, what="the drained registration")
        assert pub.metadata == {"weight": 20, "zone": "a"}  # the publisher's own metadata is unchanged
        # the guard puts back the drained registration, not the publisher's own metadata
        for key, _ in pub.client.records:
            sync.delete(key)
        time.sleep(1.5)
        wait_until(lambda: _meta(sub) == {"weight": zero, "zone": "a"}, 10, what="the drained registration back")
        sync.put(override_key(unique_key, ADDR), encode_override(5, "ops", time.time()))
        wait_until(lambda: (_meta(sub) or {}).get("weight") == ("5" if fmt == "kratos" else 5), 10)
        sync.delete(override_key(unique_key, ADDR))
        wait_until(lambda: _meta(sub) == {"weight": weight, "zone": "a"}, 10, what="the own metadata back")


def test_a_publisher_started_under_an_override_registers_drained_from_the_first_record(registry, unique_key):
    sync = registry.sync
    sync.put(override_key(unique_key, ADDR), encode_override(0, "ops", time.time()))
    seen: list[dict | None] = []
    with waypost.Subscriber(registry, unique_key, timeout=10) as sub:
        sub.add_listener(lambda: seen.append(_meta(sub)))
        with waypost.Publisher(registry, unique_key, ADDR, ttl=5):  # no metadata of its own
            wait_until(lambda: _meta(sub) == {"weight": 0}, 10)
            assert all(m in (None, {"weight": 0}) for m in seen), seen  # never seen with a full share
            sync.delete(override_key(unique_key, ADDR))
            wait_until(lambda: _meta(sub) == {}, 10, what="no metadata once the override is gone")


def test_a_bad_override_record_is_ignored(registry, unique_key):
    sync = registry.sync
    with waypost.Publisher(registry, unique_key, ADDR, ttl=5, metadata={"weight": 7}) as pub, \
            waypost.Subscriber(registry, unique_key, timeout=10) as sub:
        wait_until(lambda: _meta(sub) == {"weight": 7}, 10)
        sync.put(override_key(unique_key, ADDR), b'{"weight": -1}')
        sync.put(override_key(unique_key, ADDR), encode_override(3, "ops", 1.0))
        wait_until(lambda: _meta(sub) == {"weight": 3}, 10)
        assert pub.override is not None and pub.override["by"] == "ops"


def test_override_record_helpers():
    assert override_key("greet.rpc", "10.0.0.5:80") == "_waypost/override/greet.rpc/10.0.0.5:80"
    assert split_override_key("_waypost/override/a/b.rpc/[::1]:80") == ("a/b.rpc", "[::1]:80")
    assert split_override_key("_waypost/meta/x/1") is None
    assert parse_override(encode_override(0, "me", 1.5)) == {"weight": 0, "by": "me", "at": 1.5}
    for bad in (b"[]", b"nope", b'{"weight": 1.5}', b'{"weight": true}', b'{"by": "x"}', b'{"weight": -2}'):
        assert parse_override(bad) is None, bad
    assert apply_override({"weight": 20, "zone": "a"}, {"weight": 0}) == {"weight": 0, "zone": "a"}
    assert apply_override(None, None) is None
    with pytest.raises(ValueError):
        encode_override(-1, "x", 0)
    assert get_format("gozero").name == "gozero"
