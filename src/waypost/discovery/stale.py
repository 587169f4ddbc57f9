"""Stale beats nothing: a start during an etcd outage serves a possibly stale list rather than none.

A subscription's initial load is a linearizable Get: it needs the etcd leader. When it fails (or has
not been answered after ``STALE_AFTER`` seconds: a leaderless etcd holds a linearizable read until its
own request timeout, ~7 s), the group's ``StaleStart`` tries, in order:

1. a **serializable** read of every range (``Registry.get_values_stale``): any live member answers from
   its own copy, so a cluster that lost its quorum but whose members still answer gives its list;
2. the **cache file** of a subscriber (``Subscriber(..., cache_file=PATH)``, ``?cache=PATH``), when
   etcd cannot be read at all.

The first that works becomes the view (the subscribers' ``attach`` returns with it), marked stale: one
WARNING, ``Subscriber.stale`` is True and ``waypost_discovery_stale{key}`` is 1. The group goes on
with the linearizable load meanwhile (retried every ~1 s); when it works, its answer is applied as a
diff against the stale records (adds, deletes, value changes: a backend that is still registered is
never removed and put back), the view is live again (INFO, gauge 0), and the watch starts from the
live read's revision. Nothing stale is used when a live read came first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .. import _loop, metrics
from . import cache
from .formats import WireFormat
from .store import Registry, ValueColumns

log = logging.getLogger("waypost.discovery")

#: a linearizable initial read still unanswered after this many seconds counts as failed
STALE_AFTER = 2.0
#: how long the serializable read may take (etcd entirely down: it fails; the cache is next)
STALE_READ_TIMEOUT = 1.5


class _Group(Protocol):
    """What ``StaleStart`` needs of ``group.SharedReader`` (which imports this module)."""

    registry: Registry
    key: str
    exact: bool
    fmt: WireFormat
    ready: asyncio.Future[None] | None

    @property
    def main(self) -> Any: ...

    @property
    def sources(self) -> list[Any]: ...

    def apply_get(self, src: Any, res: ValueColumns) -> None: ...


_all: weakref.WeakSet[StaleStart] = weakref.WeakSet()


class StaleStart:
    """The stale fallback of one group's initial load (see the module docstring); on the control loop."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.cache_files: list[str] = []
        #: where the stale view came from ("a serializable read of ...", "cache file ..."), None while live
        self.source: str | None = None
        self.since = 0.0
        self.on_live: list[Callable[[], None]] = []  # called when the view becomes live
        self._trigger: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        _all.add(self)

    @property
    def stale(self) -> bool:
        return self.source is not None

    def offer_cache(self, path: str) -> None:
        """A subscriber's cache file, to read if etcd cannot be read at all at start."""
        if path not in self.cache_files:
            self.cache_files.append(path)

    def begin(self) -> None:
        """The initial load started: arm the fallback."""
        self._trigger = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"waypost-sub-stale {self.group.main.key}")

    def failed(self) -> None:
        """A linearizable initial read failed: fall back now, not after ``STALE_AFTER``."""
        if self._trigger is not None:
            self._trigger.set()

    def end(self) -> None:
        """The linearizable load is applied (or the group closes): the view is live."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.source is None:
            return
        log.info("%r: live read at revision %d after %.1fs on %s: the list is up to date again",
                 self.group, self.group.main.revision, time.monotonic() - self.since, self.source)
        self.source = None
        for fn in list(self.on_live):
            try:
                fn()
            except Exception:
                log.exception("stale listener %r failed", fn)

    def live(self, error: BaseException | None = None) -> None:
        """The initial load is done: ``end()``, and the group is ready (or failed with ``error``, unless
        a stale list was served: then the error is logged and the stale list stays)."""
        self.end()
        ready = self.group.ready
        if ready is None or ready.done():
            if error is not None:
                log.error("%r: the live read failed after a stale list was served: %s", self.group, error)
            return
        if error is not None:
            ready.set_exception(error)
        else:
            ready.set_result(None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.source = None
        self.on_live.clear()
        _all.discard(self)

    # -- the fallback -------------------------------------------------------------------------------

    def _unloaded(self) -> bool:
        """Nothing has been loaded yet (by a live read or by us) and nobody has been answered."""
        g = self.group
        return g.ready is not None and not g.ready.done() and all(
            src.revision == 0 and not src.raw for src in g.sources)

    async def _run(self) -> None:
        try:
            await self._fall_back()
        except asyncio.CancelledError:
            raise
        except Exception:  # the live load goes on without the fallback
            log.exception("%r: the stale fallback failed", self.group)

    async def _fall_back(self) -> None:
        assert self._trigger is not None
        try:
            await asyncio.wait_for(self._trigger.wait(), STALE_AFTER)
        except asyncio.TimeoutError:
            pass
        if not self._unloaded():
            return
        g = self.group
        found: tuple[str, dict[str, ValueColumns]] | None = await self._serializable()
        if found is None:
            found = self._cached()
        if found is None or not self._unloaded():
            return
        source, lists = found
        for src in reversed(g.sources):  # the metadata first, so the addresses appear with it
            g.apply_get(src, lists[src.key])
        self.source, self.since = source, time.monotonic()
        assert g.ready is not None
        log.warning("%r: etcd did not answer a linearizable read (no leader, or unreachable): using %d records "
                    "from %s, possibly stale, until it does", g, len(lists[g.main.key].keys), source)
        g.ready.set_result(None)

    async def _serializable(self) -> tuple[str, dict[str, ValueColumns]] | None:
        g = self.group
        try:
            reads = await _loop.gather_within(STALE_READ_TIMEOUT, *(
                g.registry.get_values_stale(src.key, prefix=src.prefix, timeout=STALE_READ_TIMEOUT)
                for src in g.sources))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- no member answers either: try the cache
            log.debug("%r: serializable read failed too: %s", g, e)
            return None
        if any(r is None for r in reads):
            return None
        lists = {src.key: r for src, r in zip(g.sources, reads) if r is not None}
        return f"a serializable read of {g.registry.url} (revision {lists[g.main.key].revision})", lists

    def _cached(self) -> tuple[str, dict[str, ValueColumns]] | None:
        g = self.group
        prefixes = [src.key for src in g.sources]
        for path in self.cache_files:
            try:
                got = cache.read(path, g.key, g.exact, g.fmt.name, prefixes)
            except cache.CacheError as e:
                log.warning("%r: ignoring the discovery cache file %s: %s", g, path, e)
                continue
            if not got.sources[g.main.key].keys:  # an empty stale list would only hide why there is none
                log.info("%r: the discovery cache file %s holds no address: not used", g, path)
                continue
            age = max(time.time() - got.written, 0.0)
            return f"the cache file {path} (written {age:.0f}s ago)", dict(got.sources)
        return None

    def snapshot(self) -> bytes | None:
        """The cache file's bytes for the current list; None while it is stale (nothing new to keep)."""
        g = self.group
        if self.stale or g.ready is None or not g.ready.done() or g.main.revision == 0:
            return None
        return cache.encode(g.key, g.exact, g.fmt.name, g.registry.url,
                            [(src.key, src.revision, src.raw) for src in g.sources])


def _samples() -> Iterator[metrics.DiscoverySample]:
    for s in list(_all):
        yield metrics.DiscoverySample(s.group.main.key, s.stale)


metrics.register_discovery_source(_samples)
