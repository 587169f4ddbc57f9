"""The shared view and the container's compact bookkeeping behave like the plain definitions.

- ``Container`` against a model written the obvious way (dict of lists, rebuilt tuples), over random
  sequences of changes, exclusive or not: same values, backends, keys, return values and listener calls;
- the group keeps its entries in the non-exclusive subscribers' container: a subscriber that comes
  later (exclusive, or non-exclusive after the others left) still starts from revision order.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.waiting import wait_until
from waypost.discovery import Subscriber
from waypost.discovery.container import Container
from waypost.discovery.formats import Entry


class Model:
    """go-zero's container, the plain way: address -> list of keys, oldest first."""

    def __init__(self, exclusive: bool) -> None:
        self.exclusive = exclusive
        self.mapping: dict[str, Entry] = {}
        self.by_address: dict[str, list[str]] = {}

    def apply(self, deletes: list[str], adds: list[tuple[str, Entry]]) -> bool:
        changed = False
        for key in deletes:
            changed |= self.remove(key)
        for key, entry in adds:
            changed |= self.add(key, entry)
        return changed

    def remove(self, key: str) -> bool:
        entry = self.mapping.pop(key, None)
        if entry is None:
            return False
        keys = self.by_address[entry.address]
        keys.remove(key)
        if not keys:
            del self.by_address[entry.address]
        return True

    def add(self, key: str, entry: Entry) -> bool:
        old = self.mapping.get(key)
        if old == entry:
            return False
        if old is not None:
            self.remove(key)
        if self.exclusive:
            for other in list(self.by_address.get(entry.address, ())):
                self.remove(other)
        self.by_address.setdefault(entry.address, []).append(key)
        self.mapping[key] = entry
        return True

    def state(self) -> tuple[Any, ...]:
        backends = [(a, dict(self.mapping[keys[-1]].metadata)) for a, keys in self.by_address.items()]
        return tuple(self.by_address), backends, self.mapping


def _state(c: Container) -> tuple[Any, ...]:
    return c.values(), [(b.address, dict(b.metadata)) for b in c.backends()], c.keys()


_metadata = st.sampled_from([MappingProxyType({}), MappingProxyType({"w": 1}), {"w": 1}, {"w": 2}, {}])
_entry = st.builds(Entry, st.sampled_from(["a:1", "b:1", "c:1", "d:1"]), _metadata)
_key = st.sampled_from([f"k/{i}" for i in range(6)])
_step = st.tuples(st.lists(_key, max_size=3), st.lists(st.tuples(_key, _entry), max_size=8))


@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.lists(_step, min_size=1, max_size=12))
def test_container_agrees_with_the_plain_model(exclusive, steps):
    c, model = Container(exclusive), Model(exclusive)
    calls: list[int] = []
    c.add_listener(lambda: calls.append(1))
    changes = 0
    for deletes, adds in steps:
        before = c.values(), c.backends()
        changed = c.apply(deletes, adds)
        changes += changed
        assert changed == model.apply(deletes, adds), (deletes, adds)
        assert _state(c) == model.state()
        assert len(c) == len(model.mapping)
        assert all(c.get(k) == e for k, e in model.mapping.items()) and c.get("k/none") is None
        assert all(isinstance(b.metadata, MappingProxyType) for b in c.backends())
        if not changed:  # nothing changed: the very same snapshot objects, and no listener call
            assert c.values() is before[0] and c.backends() is before[1]
    assert len(calls) == changes  # one listener call per apply that changed something


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.lists(_step, min_size=1, max_size=12))
def test_listener_calls_follow_changes(exclusive, steps):
    c, model = Container(exclusive), Model(exclusive)
    calls: list[tuple[str, ...]] = []
    c.add_listener(lambda: calls.append(c.values()))
    expected = []
    for deletes, adds in steps:
        if model.apply(deletes, adds):
            expected.append(tuple(model.by_address))
        c.apply(deletes, adds)
    assert calls == expected


def test_backends_of_untouched_addresses_are_kept_after_a_bulk_fill():
    c = Container()
    c.apply((), [(f"k/{i}", Entry(f"10.0.0.{i}:80")) for i in range(50)])
    first = c.backends()
    c.apply((), [("k/new", Entry("10.0.0.7:80", {"w": 3}))])  # a second key for one address
    after = c.backends()
    assert [b.address for b in after] == [b.address for b in first]
    assert all(a is b for a, b in zip(first, after) if a.address != "10.0.0.7:80")
    assert dict(after[7].metadata) == {"w": 3} and after[7] is not first[7]
    c.apply(["k/new"], ())
    assert dict(c.backends()[7].metadata) == {} and c.backends()[8] is first[8]


def test_a_changed_key_keeps_its_place_among_keys():
    c = Container()
    c.apply((), [("k/1", Entry("a:1")), ("k/2", Entry("b:1")), ("k/3", Entry("c:1"))])
    c.apply((), [("k/1", Entry("d:1"))])
    assert list(c.keys()) == ["k/1", "k/2", "k/3"]
    assert c.values() == ("b:1", "c:1", "d:1")  # the new address comes last, as a new one


def test_initial_load_in_revision_order_with_bad_records_and_shared_addresses(registry, unique_key, caplog):
    s = registry.sync
    for name, value in (("b", b"10.0.0.2:1"), ("a", b"10.0.0.1:1"), ("c", b"not an address"),
                        ("d", b"10.0.0.2:1"), ("0", b"10.0.0.3:1")):
        s.put(f"{unique_key}/{name}", value)
    with Subscriber(registry, unique_key) as sub:
        assert sub.values() == ["10.0.0.2:1", "10.0.0.1:1", "10.0.0.3:1"]  # revision order, not key order
        assert list(sub.container.keys()) == [f"{unique_key}/{n}" for n in "bad0"]
        assert f"{unique_key}/c" in caplog.text
        s.delete(f"{unique_key}/b")  # 10.0.0.2 still has d
        s.put(f"{unique_key}/e", b"10.0.0.4:1")
        assert wait_until(lambda: sub.values() == ["10.0.0.2:1", "10.0.0.1:1", "10.0.0.3:1", "10.0.0.4:1"], 10)
        s.delete(f"{unique_key}/d")
        assert wait_until(lambda: sub.values() == ["10.0.0.1:1", "10.0.0.3:1", "10.0.0.4:1"], 10)


def test_a_new_shared_reader_starts_from_revision_order(registry, unique_key):
    s = registry.sync
    side = f"_waypost/meta/{unique_key}"
    s.put(f"{side}/1", b'{"addr":"10.0.0.1:1","metadata":{"w":1}}')
    for i in (1, 2, 3):
        s.put(f"{unique_key}/{i}", f"10.0.0.{i}:1".encode())
    keeper = Subscriber(registry, unique_key, exclusive=True)  # keeps the shared watch alive
    try:
        a = Subscriber(registry, unique_key)
        assert a.values() == ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
        s.put(f"{side}/1", b'{"addr":"10.0.0.1:1","metadata":{"w":2}}')
        # a metadata change re-adds the address: it moves to the end of this reader's order
        assert wait_until(lambda: a.values() == ["10.0.0.2:1", "10.0.0.3:1", "10.0.0.1:1"], 10)
        a.close()
        with Subscriber(registry, unique_key) as b:  # the only shared reader now: revision order again
            assert b.values() == ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
            assert dict(b.backends()[0].metadata) == {"w": 2}
            assert b.container is not a.container
            with Subscriber(registry, unique_key) as c:  # joins b's container
                assert c.container is b.container
    finally:
        keeper.close()
        s.delete(f"{side}/", prefix=True)


def test_a_late_exclusive_subscriber_agrees_with_an_early_one(registry, unique_key):
    s = registry.sync
    s.put(f"{unique_key}/1", b"10.0.0.1:1")
    s.put(f"{unique_key}/2", b"10.0.0.1:1")
    early = Subscriber(registry, unique_key, exclusive=True)
    try:
        assert early.container.keys() == {f"{unique_key}/2": Entry("10.0.0.1:1")}  # the newer key wins
        # the same value again: nothing changes for the early one, so the late one must not
        # order by the key's new mod_revision either
        rev = s.put(f"{unique_key}/1", b"10.0.0.1:1").revision
        group = early._group
        assert group is not None
        assert wait_until(lambda: group.main.raw[f"{unique_key}/1"][1] == rev, 10)
        with Subscriber(registry, unique_key, exclusive=True) as late:
            assert late.container.keys() == early.container.keys()
            assert late.values() == early.values() == ["10.0.0.1:1"]
    finally:
        early.close()


def test_changes_after_a_big_initial_load(registry, unique_key):
    """The initial load fills the view in one pass; the changes after it go key by key."""
    s = registry.sync
    for i in range(30):
        s.put(f"{unique_key}/{i:02d}", f"10.0.0.{i}:80".encode())
    with Subscriber(registry, unique_key) as sub:
        assert sub.values() == [f"10.0.0.{i}:80" for i in range(30)]
        s.put(f"{unique_key}/05", b"10.0.9.9:80")
        s.delete(f"{unique_key}/07")
        wait_until(lambda: "10.0.0.7:80" not in sub.values(), 10)
        want = [f"10.0.0.{i}:80" for i in range(30) if i not in (5, 7)] + ["10.0.9.9:80"]
        assert sub.values() == want
        assert [b.address for b in sub.backends()] == want
        group = sub._group
        assert group is not None and group.main.raw[f"{unique_key}/05"][0] == b"10.0.9.9:80"
