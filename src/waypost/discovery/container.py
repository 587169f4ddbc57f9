"""The subscriber's local view: etcd key -> entry, address -> keys, and cached immutable snapshots.

Mutations happen on the control loop only; readers on any thread get the last published tuple (one
attribute read, no lock). Deletes are applied before adds, and an add for a key that already holds
another entry replaces it, so a value change is never lost (go-zero's reload path loses it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Any

from ..balancer.base import Backend
from ..registry.formats import Entry

log = logging.getLogger("waypost.discovery")

Listener = Callable[[], None]


def _backend_builder() -> Callable[[str, Mapping[str, Any]], Backend]:
    """``Backend(address, metadata)`` without the frozen dataclass' per-field ``object.__setattr__``
    (a big initial load builds one per address); the plain constructor if Backend changes shape."""
    slots = [Backend.__dict__.get(f) for f in ("address", "metadata")]
    if ([f.name for f in dataclasses.fields(Backend)] != ["address", "metadata"]
            or hasattr(Backend, "__post_init__")
            or not all(isinstance(s, MemberDescriptorType) for s in slots)):
        return Backend
    set_address, set_metadata = (s.__set__ for s in slots)  # type: ignore[union-attr]
    new = object.__new__

    def backend(address: str, metadata: Mapping[str, Any]) -> Backend:
        b = new(Backend)
        set_address(b, address)
        set_metadata(b, metadata)
        return b  # type: ignore[no-any-return]

    return backend


_new_backend = _backend_builder()


class Container:
    """Distinct addresses behind a set of keys; ``exclusive``: one key per address, the newest wins."""

    def __init__(self, exclusive: bool = False) -> None:
        self.exclusive = exclusive
        self._mapping: dict[str, Entry] = {}
        self._values: dict[str, list[str]] = {}  # address -> keys holding it, oldest first
        self._snapshot: tuple[str, ...] = ()
        self._backends: tuple[Backend, ...] = ()
        self._listeners: list[Listener] = []
        # Backend objects reused across rebuilds: one change to a big set rebuilds one Backend
        self._backend_of: dict[str, Backend] = {}
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
        return dict(self._mapping)

    # -- writes (control loop) ------------------------------------------------------------------

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
        """Apply deletes, then adds; rebuild the snapshot and notify listeners if anything changed."""
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
        """Fill an empty, non-exclusive container (a new subscriber on a big set) in a few tight
        passes; the result is what ``_add`` one by one would give."""
        mapping, values = self._mapping, self._values
        adds = adds if isinstance(adds, list) else list(adds)
        mapping.update(adds)
        one_each = False
        if len(mapping) == len(adds):  # distinct keys (the usual case)
            by_address = {entry[0]: [key] for key, entry in adds}
            if len(by_address) == len(adds):  # and distinct addresses: values in the order of adds
                values.update(by_address)
                one_each = True
            else:
                for key, entry in adds:
                    keys = values.get(entry[0])
                    if keys is None:
                        values[entry[0]] = [key]
                    else:
                        keys.append(key)
        else:
            mapping.clear()
            for key, entry in adds:
                old = mapping.get(key)
                if old is not None:  # the same key twice in one batch: keep the last, as _add would
                    values[old.address].remove(key)
                    if not values[old.address]:
                        del values[old.address]
                mapping[key] = entry
                keys = values.get(entry.address)
                if keys is None:
                    values[entry.address] = [key]
                else:
                    keys.append(key)
        if not mapping:
            return False
        cache = self._backend_of
        proxy = MappingProxyType
        if cache:  # not expected (an empty container holds no Backends), but stay correct
            self._touched.update(values)
            self._rebuild()
        elif one_each:  # address i is the entry of adds[i]: whole-list passes
            addresses = list(values)
            mds = [md if isinstance(md, proxy) else proxy(dict(md)) for _, (_, md) in adds]
            backends = list(map(_new_backend, addresses, mds))
            cache.update(zip(addresses, backends))
            self._touched.clear()
            self._backends = tuple(backends)
            self._snapshot = tuple(addresses)
        else:
            new = _new_backend
            for address, keys in values.items():
                md = mapping[keys[-1]][1]
                cache[address] = new(address, md if isinstance(md, proxy) else proxy(dict(md)))
            self._touched.clear()
            self._backends = tuple(cache.values())
            self._snapshot = tuple(values)
        self.notify()
        return True

    def clear(self) -> None:
        """Forget every key (no listener call)."""
        self._mapping.clear()
        self._values.clear()
        self._backend_of.clear()
        self._rebuild()

    def _add(self, key: str, entry: Entry) -> bool:
        old = self._mapping.get(key)
        if old == entry:
            return False
        if old is not None:
            self._remove(key)  # a changed value: drop the old address first
        keys = self._values.get(entry.address)
        if keys and self.exclusive:
            for other in list(keys):
                self._remove(other)
        self._values.setdefault(entry.address, []).append(key)
        self._mapping[key] = entry
        self._touched.add(entry.address)
        return True

    def _remove(self, key: str) -> bool:
        entry = self._mapping.pop(key, None)
        if entry is None:
            return False
        self._touched.add(entry.address)
        keys = self._values.get(entry.address)
        if keys is not None:
            try:
                keys.remove(key)
            except ValueError:
                pass
            if not keys:
                del self._values[entry.address]
        return True

    def _rebuild(self) -> None:
        cache = self._backend_of
        for address in self._touched:
            keys = self._values.get(address)
            if not keys:
                cache.pop(address, None)
                continue
            md = self._mapping[keys[-1]].metadata
            old = cache.get(address)
            if old is None or old.metadata is not md:
                cache[address] = Backend(address, md if isinstance(md, MappingProxyType) else MappingProxyType(dict(md)))
        self._touched.clear()
        self._backends = tuple(cache[a] for a in self._values)
        self._snapshot = tuple(self._values)

    def notify(self) -> None:
        """Call the listeners now."""
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:
                log.exception("subscriber listener %r failed", fn)
