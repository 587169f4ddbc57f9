"""go-zero's container checks, as behaviours (pure: no registry, no loop)."""

from __future__ import annotations

from waypost.discovery.container import Container
from waypost.discovery.formats import Entry
from waypost.discovery.subscriber import diff
from waypost.types import Backend


def add(c: Container, key: str, addr: str, **md) -> bool:
    return c.apply((), [(key, Entry(addr, md))])


def test_duplicate_value_survives_deletion_of_one_key():
    c = Container()
    add(c, "k/1", "a:1")
    add(c, "k/2", "a:1")
    add(c, "k/3", "b:1")
    assert c.values() == ("a:1", "b:1")
    c.apply(["k/1"])
    assert c.values() == ("a:1", "b:1")
    c.apply(["k/2"])
    assert c.values() == ("b:1",)


def test_delete_of_unknown_key_is_a_noop_and_fires_nothing():
    c = Container()
    fired = []
    c.add_listener(lambda: fired.append(1))
    add(c, "k/1", "a:1")
    assert fired == [1]
    assert c.apply(["k/404"]) is False
    assert fired == [1] and c.values() == ("a:1",)


def test_listener_fires_once_per_change_and_errors_are_contained(caplog):
    c = Container()
    calls: list[tuple[str, ...]] = []

    def boom():
        raise RuntimeError("listener bug")

    c.add_listener(boom)
    c.add_listener(lambda: calls.append(c.values()))
    c.apply((), [("k/1", Entry("a:1")), ("k/2", Entry("b:1"))])
    add(c, "k/1", "a:1")  # same entry again: no change, no call
    c.apply(["k/2"])
    assert calls == [("a:1", "b:1"), ("a:1",)]
    assert "listener bug" in caplog.text


def test_snapshot_is_cached_until_a_change():
    c = Container()
    add(c, "k/1", "a:1")
    first = c.values()
    assert c.values() is first and c.backends() is c.backends()
    add(c, "k/1", "a:1")
    assert c.values() is first
    add(c, "k/2", "b:1")
    assert c.values() is not first and c.values() == ("a:1", "b:1")


def test_exclusive_newer_key_evicts_older_keys_of_the_same_value():
    c = Container(exclusive=True)
    add(c, "k/1", "a:1")
    add(c, "k/2", "b:1")
    add(c, "k/3", "a:1")
    assert c.keys() == {"k/2": Entry("b:1"), "k/3": Entry("a:1")}
    # the evicted key's later delete is a no-op
    assert c.apply(["k/1"]) is False
    assert sorted(c.values()) == ["a:1", "b:1"]


def test_hundred_duplicate_puts_give_one_value():
    c = Container()
    for i in range(100):
        add(c, f"k/{i}", "a:1")
    assert c.values() == ("a:1",)
    assert len(c.keys()) == 100


def test_value_change_of_a_key_is_applied():
    c = Container()
    add(c, "k/1", "a:1")
    add(c, "k/1", "b:1")
    assert c.values() == ("b:1",)
    c.apply(["k/1"])
    assert c.values() == ()


def test_reload_diff_deletes_then_adds_keeps_a_changed_value():
    old = {"k/1": b"a:1", "k/2": b"b:1", "k/3": b"c:1"}
    new = {"k/1": b"x:1", "k/3": b"c:1", "k/4": b"d:1"}
    deletes, adds = diff(old, new)
    assert sorted(deletes) == ["k/1", "k/2"] and sorted(adds) == ["k/1", "k/4"]
    c = Container()
    c.apply((), [(k, Entry(v.decode())) for k, v in old.items()])
    c.apply(deletes, [(k, Entry(new[k].decode())) for k in adds])
    # go-zero applies adds before deletes here and ends up without x:1 (and with a stale a:1)
    assert sorted(c.values()) == ["c:1", "d:1", "x:1"]


def test_backends_carry_the_newest_keys_metadata():
    c = Container()
    add(c, "k/1", "a:1", weight=1)
    add(c, "k/2", "a:1", weight=5)
    add(c, "k/3", "b:1")
    assert c.backends() == (Backend("a:1", {"weight": 5}), Backend("b:1", {}))
    c.apply(["k/2"])
    assert dict(c.backends()[0].metadata) == {"weight": 1}


def _container_state(c):
    return list(c.values()), [(b.address, dict(b.metadata)) for b in c.backends()], c.keys()


def test_container_bulk_fill_equals_adding_one_by_one():
    from types import MappingProxyType

    from waypost.discovery.container import Container
    from waypost.discovery.formats import Entry

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
    # an exclusive container never takes the bulk fill: the newest key of an address wins
    excl = Container(exclusive=True)
    assert excl.apply((), [("k/1", Entry("h:1")), ("k/2", Entry("h:1"))]) is True
    assert excl.values() == ("h:1",) and list(excl.keys()) == ["k/2"]


def test_container_plain_bulk_load_equals_adding_entries():
    from waypost.discovery.container import Container
    from waypost.discovery.formats import Entry

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
