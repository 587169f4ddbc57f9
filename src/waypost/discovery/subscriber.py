"""Subscriber: the live set of addresses registered under a key, kept by Get + Watch.

Subscribers of the same (registry, key, exact, format) in a process share one reader, a ``SharedReader``
(``waypost.discovery.shared_reader``: the Get, the Watch, reloads, go-zero metadata side records).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from .. import _loop
from ..backoff import cool_down
from ..errors import suggests_keywords
from ..types import Backend
from .cache import CacheWriter
from .container import Container, Listener
from .formats import WireFormat, get_format
from .shared_reader import SharedReader, acquire_reader, active_subscriptions, diff, release_reader
from .store import Registry

__all__ = ["Subscriber", "active_subscriptions", "cool_down", "diff", "resolve_registry"]

log = logging.getLogger("waypost.discovery")


def resolve_registry(registry: Registry | str) -> Registry:
    """A Registry as given, or ``waypost.connect(url)`` for a URL string."""
    if isinstance(registry, str):
        from .connections import connect

        return connect(registry)
    if not isinstance(registry, Registry):
        raise TypeError(f"registry must be a waypost Registry or a URL string, got {type(registry).__name__}")
    return registry



class Subscriber:
    """The distinct addresses registered under ``key``, kept up to date (see the module docstring).

    ``Subscriber(registry, key)`` returns once the first Get has been applied, or raises
    ``RegistryUnavailable`` after ``timeout`` seconds (go-zero would block and retry forever; we
    fail fast so a misconfigured client notices), or ``PermissionDenied`` at once if etcd refuses. On the control loop use ``await Subscriber.open(...)``.
    ``exclusive``: a new key for an address evicts the older keys of that address.

    While etcd gives no linearizable answer at start (no leader, or unreachable), the list comes from a
    serializable read of any member, or else from ``cache_file`` (the last list an earlier subscriber
    wrote there; see ``waypost.discovery.stale``): ``stale`` is True until a live read replaces it.
    With ``cache_file`` the list is written there after each change (at most once a second) and at close.
    """

    @suggests_keywords("waypost.Subscriber")
    def __init__(
        self, registry: Registry | str, key: str, exact: bool = False, format: str | WireFormat = "gozero",
        *, exclusive: bool = False, timeout: float = 5.0, cache_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._setup(registry, key, exact, format, exclusive, cache_file)
        if _loop.in_loop():
            raise RuntimeError("Subscriber() blocks: on the control loop use `await Subscriber.open(...)`")
        _loop.run(self._open(timeout), timeout + 10)

    def _setup(self, registry: Registry | str, key: str, exact: bool, format: str | WireFormat,
               exclusive: bool, cache_file: str | os.PathLike[str] | None) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"subscriber key must be a non-empty string, got {key!r}")
        if cache_file is not None and not (isinstance(cache_file, (str, os.PathLike)) and os.fspath(cache_file)):
            raise ValueError(f"cache_file must be a non-empty path, got {cache_file!r}")
        self.cache_file = os.fspath(cache_file) if cache_file is not None else None
        self._cache: CacheWriter | None = None
        self.registry = resolve_registry(registry)
        self.key = key
        self.exact = exact
        self.format = get_format(format)
        self.exclusive = exclusive
        self._container = Container(exclusive)  # empty until opened, and again once closed
        self._listeners: list[Listener] = []
        self._group: SharedReader | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, registry: Registry | str, key: str, exact: bool = False, format: str | WireFormat = "gozero",
        *, exclusive: bool = False, timeout: float = 5.0, cache_file: str | os.PathLike[str] | None = None,
    ) -> Subscriber:
        """Create a Subscriber without blocking a thread (from the control loop or any asyncio loop)."""
        self = cls.__new__(cls)
        self._setup(registry, key, exact, format, exclusive, cache_file)
        if _loop.in_loop():
            await self._open(timeout)
        else:
            await asyncio.wrap_future(_loop.submit(self._open(timeout)))
        return self

    async def _open(self, timeout: float) -> None:
        group = acquire_reader(self.registry, self.key, self.exact, self.format)
        if self.cache_file is not None:
            group.stale.offer_cache(self.cache_file)
        try:
            container = await group.attach(self.exclusive, timeout)
        except BaseException:
            release_reader(group, None)
            raise
        self._group = group
        self._container = container
        container.add_listener(self._fire)
        if self.cache_file is not None:
            self._cache = CacheWriter(self.cache_file, group.stale.snapshot)
            group.stale.on_live.append(self._cache.changed)
            self._cache.changed()  # the list as opened (nothing is written while it is stale)

    @property
    def stale(self) -> bool:
        """True while the list comes from a serializable read or the cache file, not a live read."""
        return self._group is not None and self._group.stale.stale

    def _fire(self) -> None:
        if self._cache is not None:
            self._cache.changed()
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:
                log.exception("subscriber listener %r failed", fn)

    # -- reads (any thread, no lock) ------------------------------------------------------------

    def values(self) -> list[str]:
        """The current distinct addresses."""
        return list(self._container.values())

    def backends(self) -> tuple[Backend, ...]:
        """The current addresses with their metadata, as ``waypost.types.Backend``."""
        return self._container.backends()

    @property
    def container(self) -> Container:
        """This subscriber's local view (keys, entries, snapshots); shared by the non-exclusive
        subscribers of the same key, registry and format."""
        return self._container

    # -- listeners and lifecycle ----------------------------------------------------------------

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn()`` on the control-loop thread after each change (exceptions are logged)."""
        if not callable(fn):
            raise TypeError(f"listener must be callable, got {fn!r}")
        self._listeners.append(fn)  # effective at once; called from the loop on a copy of the list

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn``."""
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def _close_on_loop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._listeners.clear()
        self._container.remove_listener(self._fire)
        if self._cache is not None:
            self._cache.close()
            if self._group is not None and self._cache.changed in self._group.stale.on_live:
                self._group.stale.on_live.remove(self._cache.changed)
        if self._group is not None:
            release_reader(self._group, self._container)
            self._group = None
        self._container = Container(self.exclusive)

    def close(self) -> None:
        """Stop receiving updates; the shared watch ends with its last subscriber. Idempotent."""
        if _loop.in_loop():
            self._close_on_loop()
            return

        async def close() -> None:
            self._close_on_loop()

        _loop.run(close(), 10)

    async def aclose(self) -> None:
        """``close()`` for async code (from any event loop)."""
        if _loop.in_loop():
            self._close_on_loop()
        else:
            await asyncio.wrap_future(_loop.submit(self._aclose()))

    async def _aclose(self) -> None:
        self._close_on_loop()

    def __enter__(self) -> Subscriber:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Subscriber:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Subscriber {self.key!r} format={self.format.name} exact={self.exact} values={len(self.values())}>"
