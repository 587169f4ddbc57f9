"""The subscriber's local view: etcd key -> entry, address -> keys, and cached immutable snapshots.

Mutations happen on the control loop only; readers on any thread get the last published tuple (one
attribute read, no lock). Deletes are applied before adds, and an add for a key that already holds
another entry replaces it, so a value change is never lost (go-zero's reload path loses it).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Any

from ..types import Backend
from .formats import Entry

log = logging.getLogger("waypost.discovery")

Listener = Callable[[], None]


def _backends_builder() -> Callable[[list[str], Iterable[Mapping[str, Any]]], list[Backend]]:
    """``[Backend(a, m) for a, m in zip(addresses, metadata)]`` without a Python-level call per
    Backend (a big initial load builds one per address): the frozen dataclass' slots are filled
    with C-level loops. The plain constructor if Backend changes shape.

    Worth it: for 10,000 addresses the constructor takes ~7 ms, this ~2 ms, a fifth of the
    10,000-endpoint initial load of bench/discovery.py (~23 ms)."""
    slots = [Backend.__dict__.get(f) for f in ("address", "metadata")]
    if ([f.name for f in dataclasses.fields(Backend)] != ["address", "metadata"]
            or hasattr(Backend, "__post_init__")
            or not all(isinstance(s, MemberDescriptorType) for s in slots)):
        return lambda addresses, mds: list(map(Backend, addresses, mds))
    set_address, set_metadata = (s.__set__ for s in slots)  # type: ignore[union-attr]
    new, repeat = object.__new__, itertools.repeat

    def backends(addresses: list[str], mds: Iterable[Mapping[str, Any]]) -> list[Backend]:
        out = list(map(new, repeat(Backend, len(addresses))))
        deque(map(set_address, out, addresses), 0)
        deque(map(set_metadata, out, mds), 0)
        return out

    return backends


_new_backends = _backends_builder()
_key_of, _entry_of = operator.itemgetter(0), operator.itemgetter(1)  # of a (key, entry) pair
_address, _metadata = operator.itemgetter(0), operator.itemgetter(1)  # of an Entry
#: the metadata of an Entry made without any (one shared, read-only empty mapping)
_NO_METADATA: Mapping[str, Any] = Entry._field_defaults["metadata"]


def _frozen(md: Mapping[str, Any]) -> Mapping[str, Any]:
    return md if isinstance(md, MappingProxyType) else MappingProxyType(dict(md))


def _entry(held: Entry | str) -> Entry:
    """The entry a key holds: kept as the bare address when it has no metadata."""
    return Entry(held) if type(held) is str else held  # type: ignore[arg-type,return-value]


def _metadata_of(held: Entry | str) -> Mapping[str, Any]:
    return _NO_METADATA if type(held) is str else held.metadata  # type: ignore[union-attr]


class Container:
    """Distinct addresses behind a set of keys; ``exclusive``: one key per address, the newest wins."""

    def __init__(self, exclusive: bool = False) -> None:
        self.exclusive = exclusive
        # key -> entry; an entry without metadata is kept as its bare address (a big set of plain
        # registrations then keeps no Entry object per key)
        self._mapping: dict[str, Entry | str] = {}
        # address -> the keys holding it, oldest first: the bare key while there is one (nearly
        # always: a big set then costs no list per address), a list of two or more otherwise
        self._values: dict[str, str | list[str]] = {}
        self._snapshot: tuple[str, ...] = ()
        self._backends: tuple[Backend, ...] = ()
        self._listeners: list[Listener] = []
        # Backend objects reused across rebuilds (one change to a big set rebuilds one Backend);
        # None until the first change after a bulk fill, which builds it from the snapshot
        self._backend_of: dict[str, Backend] | None = {}
        self._touched: set[str] = set()

    # -- reads (any thread) ---------------------------------------------------------------------

    def values(self) -> tuple[str, ...]:
        """The distinct addresses (the same tuple object until something changes)."""
        return self._snapshot

    def backends(self) -> tuple[Backend, ...]:
        """One Backend per distinct address, with the metadata of its newest key."""
        return self._backends

    def keys(self) -> dict[str, Entry]:
        """A copy of the key -> entry mapping."""
        out = dict(self._mapping)  # one C-level copy: safe while the loop changes the original
        for key, held in out.items():
            if type(held) is str:
                out[key] = Entry(held)
        return out  # type: ignore[return-value]

    # -- control loop ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """How many keys (not addresses) the container holds."""
        return len(self._mapping)

    def get(self, key: str) -> Entry | None:
        """The entry of ``key``, or None."""
        held = self._mapping.get(key)
        return None if held is None else _entry(held)

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn()`` after each change (on the control loop; exceptions are logged)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        """Stop calling ``fn``; unknown listeners are ignored."""
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def apply(self, deletes: Iterable[str] = (), adds: Iterable[tuple[str, Entry]] = ()) -> bool:
        """Apply deletes, then adds; rebuild the snapshot and notify listeners if anything changed.

        A key whose entry changes keeps its place among ``keys()``; its address moves as a new one.
        """
        if not self._mapping and not self.exclusive and not deletes:
            return self._bulk_load(adds)
        changed = False
        for key in deletes:
            changed |= self._remove(key)
        for key, entry in adds:
            changed |= self._add(key, entry)
        if changed:
            self._rebuild()
            self.notify()
        return changed

    def _bulk_load(self, adds: Iterable[tuple[str, Entry]]) -> bool:
        """Fill an empty, non-exclusive container (a new subscriber on a big set) in a few
        whole-list passes; the result is what ``_add`` one by one would give.

        Worth it: 10,000 plain entries take ~4 ms here and ~12 ms through ``_add``, a third of the
        10,000-endpoint initial load of bench/discovery.py (~23 ms)."""
        mapping, values = self._mapping, self._values
        adds = adds if isinstance(adds, list) else list(adds)
        if not adds:
            return False
        keys = list(map(_key_of, adds))
        entries = list(map(_entry_of, adds))
        addresses = list(map(_address, entries))
        md0 = entries[0].metadata
        # one metadata object (or equal ones) for all: typically none at all
        same = (isinstance(md0, MappingProxyType)
                and operator.countOf(map(_metadata, entries), md0) == len(adds))
        mapping.update(zip(keys, addresses) if same and not md0 else zip(keys, entries))
        one_each = False
        if len(mapping) == len(adds):  # distinct keys (the usual case)
            values.update(zip(addresses, keys))
            one_each = len(values) == len(addresses)
            if not one_each:  # some address has several keys
                values.clear()
                for key, address in zip(keys, addresses):
                    self._index(key, address)
        else:  # the same key twice in one batch: the per-key path
            mapping.clear()
            for key, entry in adds:
                self._add(key, entry)
        self._touched.clear()
        mds: Iterable[Mapping[str, Any]]
        if one_each:  # address i is the entry of key i: whole-list passes
            mds = itertools.repeat(md0) if same else list(map(_metadata, entries))
        else:
            addresses = list(values)
            mds = [_metadata_of(mapping[held if type(held) is str else held[-1]]) for held in values.values()]
        if not isinstance(mds, itertools.repeat) and not all(
                map(isinstance, mds, itertools.repeat(MappingProxyType))):
            mds = list(map(_frozen, mds))
        self._backends = tuple(_new_backends(addresses, mds))
        self._snapshot = tuple(addresses)
        self._backend_of = None  # built by the first change (a set that never changes needs none)
        self.notify()
        return True

    def bulk_load_plain(self, keys: list[str], addresses: list[str]) -> bool:
        """Fill an empty, non-exclusive container with ``keys[i] -> addresses[i]``, entries without
        metadata (the big initial load): no Entry or pair per key. Any other case (a filled or
        exclusive container, a key twice, an address under several keys) takes the general path;
        the result is what ``apply((), zip(keys, map(Entry, addresses)))`` gives. Worth a fifth of
        the 10,000-endpoint initial load with ``WireFormat.decode_plain`` (see there)."""
        if self._mapping or self.exclusive or len(keys) != len(addresses):
            return self.apply((), list(zip(keys, map(Entry, addresses))))
        if not keys:
            return False
        mapping, values = self._mapping, self._values
        mapping.update(zip(keys, addresses))
        values.update(zip(addresses, keys))
        if len(mapping) != len(keys) or len(values) != len(addresses):
            mapping.clear()
            values.clear()
            return self._bulk_load(list(zip(keys, map(Entry, addresses))))
        self._touched.clear()
        self._backends = tuple(_new_backends(addresses, itertools.repeat(_NO_METADATA)))
        self._snapshot = tuple(addresses)
        self._backend_of = None  # built by the first change (a set that never changes needs none)
        self.notify()
        return True

    def clear(self) -> None:
        """Forget every key (no listener call)."""
        self._mapping.clear()
        self._values.clear()
        self._backend_of = {}
        self._touched.clear()
        self._rebuild()

    def _index(self, key: str, address: str) -> None:
        keys = self._values.get(address)
        if keys is None:
            self._values[address] = key
        elif isinstance(keys, str):
            self._values[address] = [keys, key]
        else:
            keys.append(key)

    def _unindex(self, key: str, address: str) -> None:
        self._touched.add(address)
        keys = self._values.get(address)
        if keys is None:
            return
        if isinstance(keys, str):
            if keys == key:
                del self._values[address]
            return
        try:
            keys.remove(key)
        except ValueError:
            return
        if len(keys) == 1:
            self._values[address] = keys[0]

    def _add(self, key: str, entry: Entry) -> bool:
        held = self._mapping.get(key)
        old = None if held is None else _entry(held)
        if old == entry:
            return False
        if old is not None:
            self._unindex(key, old.address)  # a changed value: drop the old address first
        address = entry.address
        if self.exclusive:
            keys = self._values.get(address)
            if keys is not None:
                for other in [keys] if type(keys) is str else list(keys):
                    self._remove(other)
        self._index(key, address)
        self._mapping[key] = entry if entry.metadata else address
        self._touched.add(address)
        return True

    def _remove(self, key: str) -> bool:
        held = self._mapping.pop(key, None)
        if held is None:
            return False
        self._unindex(key, held if type(held) is str else held.address)  # type: ignore[arg-type,union-attr]
        return True

    def _rebuild(self) -> None:
        cache = self._backend_of
        if cache is None:  # the first change after a bulk fill: the Backends it built, by address
            cache = self._backend_of = dict(zip(self._snapshot, self._backends))
        mapping, values = self._mapping, self._values
        for address in self._touched:
            keys = values.get(address)
            if keys is None:
                cache.pop(address, None)
                continue
            md = _metadata_of(mapping[keys if type(keys) is str else keys[-1]])
            old = cache.get(address)
            if old is None or old.metadata is not md:
                cache[address] = Backend(address, _frozen(md))
        self._touched.clear()
        self._backends = tuple(map(cache.__getitem__, values))
        self._snapshot = tuple(values)

    def notify(self) -> None:
        """Call the listeners now."""
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:
                log.exception("subscriber listener %r failed", fn)
