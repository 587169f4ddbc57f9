"""EtcdRegistry: the Registry contract (discovery/store.py) on waypost's etcd client."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, overload

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
from ...errors import LeaseNotFound, RegistryUnavailable
from ...etcd import records
from ...etcd.client import EtcdClient
from ...etcd.config import EtcdConfig
from ...etcd.keys import decode_key, encode_key, key_range

if TYPE_CHECKING:
    from .config import EtcdURL

log = logging.getLogger("waypost.registry.etcd")


def _kv(m: Any) -> KeyValue:
    """A KeyValue from one etcd KeyValue message (events, prev_kv, a Range whose columns do not line up)."""
    return KeyValue(decode_key(m.key), m.value, m.create_revision, m.mod_revision, m.version, m.lease)


#: each KeyValue field's slot setter, in field order (records.Columns lists the same fields in that order)
def _plain(reason: str) -> str:
    """An endpoint's reason in plain words: ``connection refused`` rather than the transport's sentence
    (``Failed to connect to remote host: Connection refused``)."""
    return "connection refused" if "connection refused" in reason.lower() else reason


_FIELD_SETTERS = [KeyValue.__dict__[f.name].__set__ for f in fields(KeyValue)]


def _keyvalues(cols: records.Columns) -> list[KeyValue]:
    """``list(map(KeyValue, *cols))`` with each slot filled by a C-level loop over its column rather
    than six ``object.__setattr__`` calls per record (the frozen dataclass' constructor). Worth it in
    bench/etcd_client.py: a prefix get of 1,000 keys whose every field is read costs 1.10-1.29x a raw
    call with this, 1.31-1.43x with the constructor (building 1,000 KeyValues: ~0.38 ms, ~0.86 ms)."""
    out = list(map(object.__new__, itertools.repeat(KeyValue, len(cols.keys))))
    columns: tuple[list[Any], ...] = cols
    for set_field, column in zip(_FIELD_SETTERS, columns, strict=True):
        deque(map(set_field, out, column), 0)
    return out


class _LazyKeyValues(Sequence[KeyValue]):
    """The records of a Range response as a read-only Sequence of KeyValue, built on first access.

    Holds the serialized response. ``len`` needs no parsing beyond the framing; any element access
    builds all the KeyValues once from the columns (etcd/records.py; from one message per record
    when the columns do not line up), then drops the bytes. Safe from any thread: a race just builds
    twice. Equal to a list of the same KeyValues, so ``res.kvs == []`` keeps working.
    """

    __slots__ = ("_data", "_list", "_n")

    def __init__(self, data: bytes, n: int) -> None:
        self._data: bytes | None = data
        self._n = n
        self._list: list[KeyValue] | None = None

    # Read _data before _list: _list is set before _data is dropped, so a None _list means the
    # _data read just before was still the response (no lock needed for concurrent readers).
    def _items(self) -> list[KeyValue]:
        data = self._data
        items = self._list
        if items is None:
            assert data is not None
            cols = records.columns(data, self._n)
            if cols is None:
                items = list(map(_kv, records.messages(data)))
            else:
                items = _keyvalues(cols)
            self._list = items
            self._data = None
        return items

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> KeyValue: ...

    @overload
    def __getitem__(self, i: slice) -> list[KeyValue]: ...

    def __getitem__(self, i: int | slice) -> KeyValue | list[KeyValue]:
        return self._items()[i]

    def __iter__(self) -> Iterator[KeyValue]:
        return iter(self._items())

    def __reversed__(self) -> Iterator[KeyValue]:
        return reversed(self._items())

    def __contains__(self, x: object) -> bool:
        return x in self._items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LazyKeyValues):
            other = other._items()
        if isinstance(other, list):  # as the list it stands for: never equal to a tuple
            return len(self) == len(other) and self._items() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable-looking like the list it stands for

    def __repr__(self) -> str:
        return repr(self._items())


def _event(ev: Any) -> Event:
    prev = _kv(ev.prev_kv) if ev.HasField("prev_kv") else None
    return Event("delete" if ev.type == 1 else "put", _kv(ev.kv), prev)


def _columns(data: bytes) -> ValueColumns:
    """A serialized RangeResponse as ``ValueColumns``."""
    head = records.head(data)
    cols = records.columns(data, head.records)
    if cols is not None:
        return ValueColumns(cols.keys, cols.values, cols.mod_revisions, head.revision)
    kvs = records.messages(data)  # the records do not line up as columns: one message each
    return ValueColumns(records.decode_keys([m.key for m in kvs]), [m.value for m in kvs],
                        [m.mod_revision for m in kvs], head.revision)


def _note_read(client: EtcdClient, res: ValueColumns) -> None:
    """Tell the watch manager what a read saw: a subscriber watches from this revision + 1, so a
    store found below it later went back in time (the watch stream notes what it sees too, but it
    may die before its first answer); and the newest record read, which a store that only reached
    that revision again after being emptied does not hold (``WatchManager.note_record``)."""
    watches = client.watches
    watches.note_revision(res.revision)
    mods = res.mod_revisions
    if mods:
        newest = max(mods)  # (C-level passes: a 10,000-record read pays well under a millisecond)
        if newest > watches.record_revision:
            i = mods.index(newest)
            watches.note_record(encode_key(res.keys[i]), newest, res.values[i])


class EtcdRegistry(Registry):
    """A Registry over one etcd endpoint set. Get shared instances with ``waypost.connect(url)``.

    The gRPC client is created lazily on the control loop by the first call, so constructing a
    registry never touches the network.
    """

    def __init__(self, config: EtcdConfig, url: str | None = None) -> None:
        self.config = config
        self.url = url or "etcd://" + ",".join(config.endpoints)
        self._client: EtcdClient | None = None
        self._closed = False
        self._on_close: list[Any] = []

    def __repr__(self) -> str:
        return f"<EtcdRegistry {self.url}>"

    def dial_target(self, key: str) -> str:
        from .target import dial_target  # the target grammar: loaded when a channel is dialed this way

        return dial_target(self.config, key)

    @property
    def client(self) -> EtcdClient:
        """The underlying etcd client (created on first use; only on the control loop)."""
        if self._closed:
            raise RegistryUnavailable(f"{self.url}: registry is closed")
        c = self._client
        if c is None:
            if not _loop.in_loop():
                raise RuntimeError("EtcdRegistry.client must be used on the control loop (waypost._loop)")
            c = self._client = EtcdClient(self.config)
        return c

    async def get(
        self, key: str, *, prefix: bool = False, revision: int = 0, keys_only: bool = False,
        count_only: bool = False, limit: int = 0,
    ) -> GetResult:
        k, end = key_range(key, prefix)
        client = self.client
        data = await client.range_serialized(k, end, revision=revision, limit=limit, keys_only=keys_only,
                                             count_only=count_only)
        head = records.head(data)
        client.watches.note_revision(head.revision)
        return GetResult(_LazyKeyValues(data, head.records), head.revision, head.total)

    async def get_values(self, key: str, *, prefix: bool = False) -> ValueColumns:
        k, end = key_range(key, prefix)
        client = self.client
        res = _columns(await client.range_serialized(k, end))
        _note_read(client, res)
        return res

    async def get_values_stale(self, key: str, *, prefix: bool = False,
                               timeout: float = 2.0) -> ValueColumns | None:
        """A serializable Range: the first member that answers serves it from its own store (no leader
        needed, possibly behind the cluster)."""
        k, end = key_range(key, prefix)
        client = self.client
        res = _columns(await client.range_serialized(k, end, serializable=True, timeout=timeout))
        _note_read(client, res)  # behind the cluster perhaps, but a revision and records it had
        return res

    async def put(self, key: str, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> PutResult:
        client = self.client
        floor = client.watches.write_floor()
        r = await client.put(encode_key(key), bytes(value), lease=lease, prev_kv=prev_kv)
        client.watches.note_write(r.header.revision, floor)  # an answer below the floor: a reset store
        prev = _kv(r.prev_kv) if r.HasField("prev_kv") else None
        return PutResult(r.header.revision, prev)

    async def delete(self, key: str, *, prefix: bool = False, prev_kv: bool = False) -> DeleteResult:
        k, end = key_range(key, prefix)
        client = self.client
        floor = client.watches.write_floor()
        r = await client.delete_range(k, end, prev_kv=prev_kv)
        client.watches.note_write(r.header.revision, floor)
        return DeleteResult(r.header.revision, r.deleted, [_kv(m) for m in r.prev_kvs])

    async def grant(self, ttl: int) -> int:
        return int((await self.client.lease_grant(ttl)).ID)

    async def revoke(self, lease_id: int) -> None:
        try:
            await self.client.lease_revoke(lease_id)
        except LeaseNotFound:
            pass  # already gone: the contract says revoking an unknown lease is fine

    async def time_to_live(self, lease_id: int) -> int:
        r = await self.client.lease_time_to_live(lease_id)
        return int(r.TTL) if r.TTL >= 0 else -1

    def keep_alive(self, lease_id: int, ttl: int, on_lost: LeaseLostCallback) -> KeepAlive:
        """Keep a lease alive on the shared stream; callable from any thread. ``on_lost`` runs on the loop.

        The etcd client's handle (``etcd.lease.LeaseKeepAlive``) is the contract's ``KeepAlive`` as is.
        """
        if self._client is None and not _loop.in_loop():
            _loop.run(self._ensure_client(), 10)
        client = self._client or self.client
        return client.keep_alive(lease_id, ttl, on_lost)

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
              progress_notify: bool = False) -> Watch:
        """Watch a key or prefix; safe to call from any thread (the watch starts on the control loop).

        The etcd client's watcher becomes the contract's ``Watch`` with ``_event`` as its converter:
        its batches are lists of ``Event``.
        """
        k, end = key_range(key, prefix)
        if self._client is None and not _loop.in_loop():
            _loop.run(self._ensure_client(), 10)
        client = self._client or self.client
        return client.watch(k, end, start_revision=start_revision, prev_kv=prev_kv,
                            progress_notify=progress_notify, convert=_event)

    async def _ensure_client(self) -> None:
        _ = self.client

    async def compact(self, revision: int) -> None:
        await self.client.compact(revision, physical=True)

    async def status(self) -> Any:
        """The status message of the member in use (version, leader, db size...)."""
        return await self.client.status()

    async def unreachable(self) -> str | None:
        reasons = await self.client.pool.why_unreachable()  # "address: reason" per endpoint not connected
        return "; ".join(f"etcd at {address} unreachable: {_plain(reason)}"
                         for address, _, reason in (r.partition(": ") for r in reasons)) or None

    async def close(self) -> None:
        """Close the client (keepalives stop, watches end) and drop this registry from connect's cache."""
        if self._closed:
            return
        self._closed = True
        for cb in self._on_close:
            try:
                cb(self)
            except Exception:
                log.exception("close hook failed")
        if self._client is not None:
            await self._client.close()


def from_url(url: EtcdURL) -> EtcdRegistry:
    """The registry of a parsed ``etcd://`` URL (the kind's ``registry``: ``waypost.connect`` shares it)."""
    return EtcdRegistry(url.config, url.redacted)
