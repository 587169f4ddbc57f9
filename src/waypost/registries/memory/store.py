"""An in-process registry with etcd's semantics, for tests, examples and single-process setups.

Stores are named: every ``MemoryRegistry`` (and every ``connect("memory://NAME")``) with the same name
in a process sees the same keys, leases and revisions. A ``MemoryRegistry`` object is a *handle* on a
store, like an etcd client on a cluster: closing a handle ends its watches and keepalives, the data
stays (and its leases then expire by TTL, as they would in etcd when a client goes away).

Semantics follow etcd v3:
- a store-wide revision starting at 1; +1 per write (a delete of N keys, a lease expiry removing N
  keys: one revision); a delete that removes nothing does not write;
- per key: create_revision, mod_revision, version (reset when the key is deleted), lease;
- leases expire ``ttl`` seconds after the last renewal (timers on the control loop); their keys are
  deleted and delete events are emitted;
- watches deliver every event after ``start_revision`` in revision order, one batch per revision;
  a start revision below the compaction point raises ``Compacted(compact_revision)``;
- reads at a past revision are served from per-key history until it is compacted.

Everything runs on the control-plane loop (``waypost._loop``), so the store needs no lock.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import itertools
import logging
import threading
import urllib.parse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ... import _loop
from ...discovery.store import (
    DeleteResult,
    Event,
    GetResult,
    KeepAlive,
    KeyValue,
    LeaseLostCallback,
    PutResult,
    Registry,
    ValueColumns,
    Watch,
)
from ...errors import Compacted, LeaseNotFound, RegistryError, RegistryUnavailable

if TYPE_CHECKING:
    from .config import MemoryURL

log = logging.getLogger("waypost.registry.memory")

_lease_ids = itertools.count(0x694D_0000_0001)  # arbitrary start, so lease ids look like etcd's


def _bkey(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _prefix_end(prefix: bytes) -> bytes | None:
    """etcd's prefix range end: the prefix with its last byte < 0xff incremented (None: to the end)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def _strip_value(kv: KeyValue) -> KeyValue:
    return dataclasses.replace(kv, value=b"")


class _Lease:
    __slots__ = ("deadline", "id", "keepers", "keys", "timer", "ttl")

    def __init__(self, lease_id: int, ttl: int) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.keys: set[str] = set()
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.keepers: set[_MemKeepAlive] = set()


class _Store:
    """The shared data of one named memory registry (touched only on the control loop)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.revision = 1
        self.compact_revision = 0
        # key -> list of (revision, kv or None for a tombstone), oldest first
        self.history: dict[str, list[tuple[int, KeyValue | None]]] = {}
        self.sorted_keys: list[bytes] = []  # encoded keys that have any history, sorted like etcd
        self.current: dict[str, KeyValue] = {}
        self.events: list[tuple[int, list[Event]]] = []  # one entry per revision, oldest first
        self.leases: dict[int, _Lease] = {}
        self.watches: set[_MemWatch] = set()

    # -- writes ---------------------------------------------------------------------------------

    def _record(self, key: str, kv: KeyValue | None) -> None:
        hist = self.history.get(key)
        if hist is None:
            hist = self.history[key] = []
            bisect.insort(self.sorted_keys, _bkey(key))
        hist.append((self.revision, kv))

    def _publish(self, events: list[Event]) -> None:
        self.events.append((self.revision, events))
        for w in list(self.watches):
            w._offer(self.revision, events)

    def put(self, key: str, value: bytes, lease: int) -> PutResult:
        if lease and lease not in self.leases:
            raise LeaseNotFound(f"lease {lease} not found")
        prev = self.current.get(key)
        self.revision += 1
        rev = self.revision
        kv = KeyValue(
            key=key, value=bytes(value), create_revision=prev.create_revision if prev else rev,
            mod_revision=rev, version=prev.version + 1 if prev else 1, lease=lease,
        )
        if prev is not None and prev.lease and prev.lease != lease and prev.lease in self.leases:
            self.leases[prev.lease].keys.discard(key)
        if lease:
            self.leases[lease].keys.add(key)
        self.current[key] = kv
        self._record(key, kv)
        self._publish([Event("put", kv, prev)])
        return PutResult(revision=rev, prev_kv=prev)

    def delete_keys(self, keys: list[str]) -> tuple[int, list[KeyValue]]:
        """Delete existing keys in one revision; returns (revision, deleted kvs)."""
        prevs = [self.current[k] for k in keys if k in self.current]
        if not prevs:
            return self.revision, []
        self.revision += 1
        rev = self.revision
        events = []
        for prev in prevs:
            del self.current[prev.key]
            if prev.lease and prev.lease in self.leases:
                self.leases[prev.lease].keys.discard(prev.key)
            self._record(prev.key, None)
            events.append(Event("delete", KeyValue(key=prev.key, value=b"", mod_revision=rev), prev))
        self._publish(events)
        return rev, prevs

    # -- reads ----------------------------------------------------------------------------------

    def matching(self, key: str, prefix: bool) -> list[str]:
        """Keys with history in the range (sorted by bytes, as etcd returns them)."""
        bk = _bkey(key)
        if not prefix:
            return [key] if key in self.history else []
        end = _prefix_end(bk)
        lo = bisect.bisect_left(self.sorted_keys, bk)
        hi = len(self.sorted_keys) if end is None else bisect.bisect_left(self.sorted_keys, end)
        return [b.decode("utf-8", "surrogateescape") for b in self.sorted_keys[lo:hi]]

    def at(self, key: str, revision: int) -> KeyValue | None:
        hist = self.history.get(key)
        if not hist:
            return None
        if revision <= 0:
            return self.current.get(key)
        i = bisect.bisect_right(hist, revision, key=lambda e: e[0])
        return hist[i - 1][1] if i else None

    def compact(self, revision: int) -> None:
        if revision <= self.compact_revision:
            raise Compacted(self.compact_revision, f"mvcc: revision {revision} has been compacted")
        if revision > self.revision:
            raise RegistryError(f"mvcc: required revision {revision} is a future revision")
        self.compact_revision = revision
        cut = bisect.bisect_left(self.events, revision, key=lambda e: e[0])
        del self.events[:cut]
        for key in list(self.history):
            hist = self.history[key]
            # keep the newest entry at or below the compaction point unless it is a tombstone
            i = bisect.bisect_right(hist, revision, key=lambda e: e[0])
            if i == 0:
                continue
            keep_from = i - 1 if hist[i - 1][1] is not None else i
            del hist[:keep_from]
            if not hist:
                del self.history[key]
                bk = _bkey(key)
                j = bisect.bisect_left(self.sorted_keys, bk)
                if j < len(self.sorted_keys) and self.sorted_keys[j] == bk:
                    del self.sorted_keys[j]

    # -- leases ---------------------------------------------------------------------------------

    def arm(self, lease: _Lease) -> None:
        loop = asyncio.get_running_loop()
        if lease.timer is not None:
            lease.timer.cancel()
        lease.deadline = loop.time() + lease.ttl
        lease.timer = loop.call_at(lease.deadline, self.expire, lease.id)

    def expire(self, lease_id: int) -> None:
        lease = self.leases.get(lease_id)
        if lease is not None:
            log.debug("memory registry %s: lease %d expired", self.name, lease_id)
            self.drop_lease(lease, LeaseNotFound(f"lease {lease_id} expired"))

    def drop_lease(self, lease: _Lease, reason: BaseException) -> None:
        del self.leases[lease.id]
        if lease.timer is not None:
            lease.timer.cancel()
        self.delete_keys(sorted(lease.keys))
        for keeper in list(lease.keepers):
            keeper._lost(reason)


_stores: dict[str, _Store] = {}
_shared: dict[str, MemoryRegistry] = {}
_names_lock = threading.RLock()


def _store(name: str) -> _Store:
    with _names_lock:
        store = _stores.get(name)
        if store is None:
            store = _stores[name] = _Store(name)
        return store


class _MemWatch(Watch):
    """A watch on a memory store: history from ``start_revision``, then live events."""

    def __init__(
        self, reg: MemoryRegistry, key: str, prefix: bool, start_revision: int, prev_kv: bool,
    ) -> None:
        self._reg = reg
        self._key = key
        self._bk = _bkey(key)
        self._end = _prefix_end(self._bk) if prefix else None
        self._prefix = prefix
        self._want_prev = prev_kv
        # 0 means "from now": fixed when created, so events between watch() and iteration are kept
        self._start = start_revision if start_revision > 0 else reg._store.revision + 1
        self._revision = self._start - 1
        self._pending: collections.deque[tuple[int, list[Event]]] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._attached = False
        self._cancelled = False

    @property
    def revision(self) -> int:
        return self._revision

    def _matches(self, key: str) -> bool:
        if not self._prefix:
            return key == self._key
        bk = _bkey(key)
        return bk >= self._bk and (self._end is None or bk < self._end)

    def _filter(self, events: list[Event]) -> list[Event]:
        out = [e for e in events if self._matches(e.kv.key)]
        if not self._want_prev:
            out = [dataclasses.replace(e, prev_kv=None) if e.prev_kv is not None else e for e in out]
        return out

    def _offer(self, revision: int, events: list[Event]) -> None:
        if revision < self._start:
            return
        batch = self._filter(events)
        if batch:
            self._pending.append((revision, batch))
            if self._wakeup is not None:
                self._wakeup.set()

    def _attach(self) -> None:
        """Replay history from the start revision and subscribe (on the loop, at first iteration)."""
        store = self._reg._store
        self._attached = True
        # as in etcd: the state at the compaction point is kept, so only an older start is lost
        if self._start < store.compact_revision:
            self._cancelled = True
            raise Compacted(store.compact_revision)
        i = bisect.bisect_left(store.events, self._start, key=lambda e: e[0])
        for rev, events in store.events[i:]:
            self._offer(rev, events)
        store.watches.add(self)
        self._reg._watches.add(self)

    def __aiter__(self) -> AsyncIterator[list[Event]]:
        return self

    async def __anext__(self) -> list[Event]:
        if self._cancelled and not self._pending:
            raise StopAsyncIteration
        if self._reg._closed:
            self.cancel()
            raise StopAsyncIteration
        if not self._attached:
            self._attach()
        while not self._pending:
            if self._cancelled:
                raise StopAsyncIteration
            if self._wakeup is None:
                self._wakeup = asyncio.Event()
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._cancelled:
            raise StopAsyncIteration
        rev, batch = self._pending.popleft()
        self._revision = rev
        return batch

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._pending.clear()

        def detach() -> None:
            self._reg._store.watches.discard(self)
            self._reg._watches.discard(self)
            if self._wakeup is not None:
                self._wakeup.set()

        if _loop.in_loop():
            detach()
        else:
            _loop.call_soon(detach)


class _MemKeepAlive(KeepAlive):
    """Renews a lease every ttl/3 seconds until cancelled; reports the lease's loss once."""

    def __init__(self, reg: MemoryRegistry, lease_id: int, ttl: int, on_lost: LeaseLostCallback) -> None:
        self._reg = reg
        self.lease_id = lease_id
        self._interval = max(ttl, 1) / 3.0
        self._on_lost = on_lost
        self._timer: asyncio.TimerHandle | None = None
        self._done = False

    def _begin(self) -> None:
        lease = self._reg._store.leases.get(self.lease_id)
        if lease is None:
            self._lost(LeaseNotFound(f"lease {self.lease_id} not found"))
            return
        lease.keepers.add(self)
        self._reg._keepalives.add(self)
        self._renew()

    def _renew(self) -> None:
        if self._done:
            return
        store = self._reg._store
        lease = store.leases.get(self.lease_id)
        if lease is None:
            self._lost(LeaseNotFound(f"lease {self.lease_id} not found"))
            return
        store.arm(lease)
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._renew)

    def _lost(self, reason: BaseException | None) -> None:
        if self._done:
            return
        self._stop()
        try:
            self._on_lost(self.lease_id, reason)
        except Exception:
            log.exception("lease %d: on_lost callback failed", self.lease_id)

    def _stop(self) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        lease = self._reg._store.leases.get(self.lease_id)
        if lease is not None:
            lease.keepers.discard(self)
        self._reg._keepalives.discard(self)

    def cancel(self) -> None:
        if _loop.in_loop():
            self._stop()
        else:
            _loop.call_soon(self._stop)


class MemoryRegistry(Registry):
    """A handle on the named in-process store ``name`` (see the module docstring)."""

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self.url = f"memory://{name}"
        self._store = _store(name)
        self._watches: set[_MemWatch] = set()
        self._keepalives: set[_MemKeepAlive] = set()
        self._closed = False

    def dial_target(self, key: str) -> str:
        return f"{self.url}/?{urllib.parse.urlencode({'key': key})}"

    @classmethod
    def get_or_create(cls, name: str = "default") -> MemoryRegistry:
        """The process-wide shared handle for ``name`` (a new one if the previous one was closed)."""
        with _names_lock:
            reg = _shared.get(name)
            if reg is None or reg._closed:
                reg = _shared[name] = cls(name)
            return reg

    named = get_or_create

    @classmethod
    def drop(cls, name: str) -> None:
        """Forget the store ``name`` (open handles keep the old data; new ones start empty)."""
        with _names_lock:
            _stores.pop(name, None)
            _shared.pop(name, None)

    def __repr__(self) -> str:
        return f"MemoryRegistry({self.name!r})"

    def _check(self) -> _Store:
        if self._closed:
            raise RegistryUnavailable(f"{self.url}: registry handle is closed")
        return self._store

    async def get(
        self, key: str, *, prefix: bool = False, revision: int = 0, keys_only: bool = False,
        count_only: bool = False, limit: int = 0,
    ) -> GetResult:
        store = self._check()
        if revision > store.revision:
            raise RegistryError(f"mvcc: required revision {revision} is a future revision")
        if 0 < revision < store.compact_revision:
            raise Compacted(store.compact_revision)
        kvs: list[KeyValue] = []
        for k in store.matching(key, prefix):
            kv = store.at(k, revision)
            if kv is not None:
                kvs.append(kv)
        count = len(kvs)
        if count_only:
            return GetResult(kvs=[], revision=store.revision, count=count)
        if limit > 0:
            kvs = kvs[:limit]
        if keys_only:
            kvs = [_strip_value(kv) for kv in kvs]
        return GetResult(kvs=kvs, revision=store.revision, count=count)

    async def get_values(self, key: str, *, prefix: bool = False) -> ValueColumns:
        store = self._check()
        kvs = [kv for kv in map(store.current.get, store.matching(key, prefix)) if kv is not None]
        return ValueColumns([kv.key for kv in kvs], [kv.value for kv in kvs], [kv.mod_revision for kv in kvs],
                            store.revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> PutResult:
        store = self._check()
        res = store.put(key, value, lease)
        return res if prev_kv else PutResult(revision=res.revision)

    async def delete(self, key: str, *, prefix: bool = False, prev_kv: bool = False) -> DeleteResult:
        store = self._check()
        keys = [k for k in store.matching(key, prefix) if k in store.current]
        rev, prevs = store.delete_keys(keys)
        return DeleteResult(revision=rev, deleted=len(prevs), prev_kvs=prevs if prev_kv else [])

    async def grant(self, ttl: int) -> int:
        store = self._check()
        if ttl <= 0:
            raise RegistryError(f"lease TTL must be positive, got {ttl}")
        lease = _Lease(next(_lease_ids), int(ttl))
        store.leases[lease.id] = lease
        store.arm(lease)
        return lease.id

    async def revoke(self, lease_id: int) -> None:
        store = self._check()
        lease = store.leases.get(lease_id)
        if lease is not None:
            store.drop_lease(lease, LeaseNotFound(f"lease {lease_id} revoked"))

    async def time_to_live(self, lease_id: int) -> int:
        store = self._check()
        lease = store.leases.get(lease_id)
        if lease is None:
            return -1
        return max(0, int(lease.deadline - asyncio.get_running_loop().time()))

    def keep_alive(self, lease_id: int, ttl: int, on_lost: LeaseLostCallback) -> KeepAlive:
        self._check()
        ka = _MemKeepAlive(self, lease_id, ttl, on_lost)
        if _loop.in_loop():
            ka._begin()
        else:
            _loop.call_soon(ka._begin)
        return ka

    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
    ) -> Watch:
        self._check()
        return _MemWatch(self, key, prefix, start_revision, prev_kv)

    async def compact(self, revision: int) -> None:
        self._check().compact(revision)

    async def close(self) -> None:
        """End this handle's watches and keepalives; the store's data stays."""
        if self._closed:
            return
        self._closed = True
        for w in list(self._watches):
            w.cancel()
        for ka in list(self._keepalives):
            ka._stop()



def from_url(url: MemoryURL) -> MemoryRegistry:
    """A handle on the store a parsed ``memory://NAME`` URL names (the kind's ``registry``)."""
    return MemoryRegistry(url.name)
