"""The Registry contract: what discovery needs from a key-value store with leases and watches.

Every backend (etcd, memory) implements this with the same semantics:
- a store-wide revision that increases by one per write transaction;
- keys are ``str`` (UTF-8; undecodable bytes kept via ``surrogateescape``), values are ``bytes``;
- leases with a TTL in seconds; keys put under a lease disappear when it expires or is revoked;
- watches from a start revision that see exactly the events after it, in order, once each, across
  reconnects; a start revision older than the compaction point raises ``Compacted``.

All coroutine methods run on the control-plane loop (``waypost._loop``). ``SyncRegistry`` is a thin
blocking facade for the CLI, scripts and tests.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .. import _loop


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    type: Literal["put", "delete"]
    kv: KeyValue  # for a delete: the key, empty value, mod_revision = the delete's revision
    prev_kv: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class GetResult:
    """What ``Registry.get`` returns.

    ``kvs`` is a read-only ``Sequence[KeyValue]`` in key order that compares equal to the list of
    the same KeyValues (``res.kvs == []`` works). The memory backend gives a list; the etcd backend
    gives a lazy sequence that builds the KeyValues on first element access, since converting a big
    response costs more than reading it. Do not mutate it: copy with ``list(res.kvs)``.
    """

    kvs: Sequence[KeyValue]
    revision: int  # the store revision the read was served at (header revision)
    count: int = 0


@dataclass(frozen=True, slots=True)
class ValueColumns:
    """What ``Registry.get_values`` returns: the records of a key or prefix as parallel lists, in key
    order (one list per field rather than one object per record: a subscriber's initial load reads
    thousands of records and needs only these three fields)."""

    keys: list[str]
    values: list[bytes]
    mod_revisions: list[int]
    revision: int  # the store revision the read was served at (header revision)


@dataclass(frozen=True, slots=True)
class PutResult:
    revision: int
    prev_kv: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    revision: int
    deleted: int
    prev_kvs: list[KeyValue] = field(default_factory=list)


class Watch(Protocol):
    """A running watch: an async iterator of event batches (all events of one revision arrive together).

    Iteration raises ``waypost.errors.Compacted`` (with ``compact_revision``) when the start revision
    has been compacted, or its subclass ``StoreReset`` when the store went back in time (an etcd
    restored from a snapshot or restarted with an empty data directory): either way, reload.
    ``PermissionDenied``/``RegistryError`` when the server cancels the watch for another
    reason. Lost connections are NOT errors: the watch resumes after the last delivered revision on
    its own. ``cancel()`` ends the iteration (StopAsyncIteration).

    A protocol: a backend's watch object satisfies it by shape (the etcd client's watcher knows
    nothing of this module), and a backend may also subclass it.
    """

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[list[Event]]: ...

    @abc.abstractmethod
    async def __anext__(self) -> list[Event]: ...

    @abc.abstractmethod
    def cancel(self) -> None: ...

    @property
    @abc.abstractmethod
    def revision(self) -> int:
        """The revision up to which events have been delivered (or start_revision - 1)."""
        ...


class KeepAlive(Protocol):
    """Handle of a lease being kept alive. ``on_lost(lease_id, reason)`` is called once when it is lost.

    A protocol, like ``Watch``: the etcd client's keepalive handle satisfies it by shape.
    """

    lease_id: int

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop renewing (does not revoke)."""
        ...


LeaseLostCallback = Callable[[int, BaseException | None], None]


class Registry(abc.ABC):
    """A key-value store with revisions, leases and watches. Obtain one with ``waypost.connect(url)``."""

    #: the URL it was created from, with any password removed
    url: str

    @abc.abstractmethod
    def dial_target(self, key: str) -> str:
        """The dial target that reads ``key`` in this registry, through the same shared connection
        (``waypost.dial(registry=..., key=...)``)."""

    @abc.abstractmethod
    async def get(
        self, key: str, *, prefix: bool = False, revision: int = 0, keys_only: bool = False,
        count_only: bool = False, limit: int = 0,
    ) -> GetResult: ...

    @abc.abstractmethod
    async def get_values(self, key: str, *, prefix: bool = False) -> ValueColumns:
        """The current keys, values and mod_revisions of ``key`` (or every key under it with
        ``prefix``) as columns: what ``get`` reads, without a KeyValue per record."""

    async def get_values_stale(self, key: str, *, prefix: bool = False,
                               timeout: float = 2.0) -> ValueColumns | None:
        """``get_values`` answered by any one member from its own copy, without asking a leader (etcd's
        serializable read): it works while the cluster has no quorum, but may be behind. For a start
        during an outage only (``waypost.discovery.stale``); None when the backend has no such read
        (the memory registry: its reads never wait for a leader)."""
        return None

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> PutResult: ...

    @abc.abstractmethod
    async def delete(self, key: str, *, prefix: bool = False, prev_kv: bool = False) -> DeleteResult: ...

    @abc.abstractmethod
    async def grant(self, ttl: int) -> int:
        """Grant a lease of ``ttl`` seconds; returns its id."""

    @abc.abstractmethod
    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys are deleted). Revoking an unknown lease is not an error."""

    @abc.abstractmethod
    async def time_to_live(self, lease_id: int) -> int:
        """Remaining TTL in seconds, or -1 when the lease does not exist."""

    @abc.abstractmethod
    def keep_alive(self, lease_id: int, ttl: int, on_lost: LeaseLostCallback) -> KeepAlive:
        """Keep a lease alive (on the shared keepalive stream) until cancelled or lost."""

    @abc.abstractmethod
    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
    ) -> Watch:
        """Watch a key or prefix from ``start_revision`` (0: from now)."""

    @abc.abstractmethod
    async def compact(self, revision: int) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def unreachable(self) -> str | None:
        """Why the store cannot be reached now, for error messages (``etcd at h:2379 unreachable:
        connection refused``); None when it can, or when the backend cannot tell."""
        return None

    @property
    def sync(self) -> SyncRegistry:
        """A blocking facade running each call on the control-plane loop."""
        return SyncRegistry(self)


class SyncRegistry:
    """Blocking calls on a Registry, for the CLI, scripts and tests (not for the control plane itself)."""

    def __init__(self, registry: Registry, timeout: float | None = 30.0) -> None:
        self.registry = registry
        self.timeout = timeout

    def _run(self, coro: Any) -> Any:
        return _loop.run(coro, self.timeout)

    def get(self, key: str, **kw: Any) -> GetResult:
        return self._run(self.registry.get(key, **kw))  # type: ignore[no-any-return]

    def get_values(self, key: str, **kw: Any) -> ValueColumns:
        return self._run(self.registry.get_values(key, **kw))  # type: ignore[no-any-return]

    def put(self, key: str, value: bytes | str, **kw: Any) -> PutResult:
        if isinstance(value, str):
            value = value.encode()
        return self._run(self.registry.put(key, value, **kw))  # type: ignore[no-any-return]

    def delete(self, key: str, **kw: Any) -> DeleteResult:
        return self._run(self.registry.delete(key, **kw))  # type: ignore[no-any-return]

    def grant(self, ttl: int) -> int:
        return self._run(self.registry.grant(ttl))  # type: ignore[no-any-return]

    def revoke(self, lease_id: int) -> None:
        self._run(self.registry.revoke(lease_id))

    def time_to_live(self, lease_id: int) -> int:
        return self._run(self.registry.time_to_live(lease_id))  # type: ignore[no-any-return]

    def compact(self, revision: int) -> None:
        self._run(self.registry.compact(revision))

    def close(self) -> None:
        self._run(self.registry.close())
