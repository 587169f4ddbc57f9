"""The shared reader behind every Subscriber of one (registry, key, exact, format) in the process.

One ``SharedReader`` does the reading: a Get of the prefix (``<key>/``; exact mode: the key itself), then a
Watch from the Get's revision + 1. The group keeps its decoded entries in a non-exclusive ``Container``
that its non-exclusive subscribers share (one copy of a big set); each exclusive subscriber gets a
container of its own, fed with the same changes (``exclusive`` is per subscriber). Compaction or any
watch failure triggers a reload: Get again, diff against the cache, apply deletes then adds, watch from
the new revision; while the registry is unreachable the reload retries every ~1 s (jittered) and the
last known addresses stay in place. The group's watch stops when its last subscriber closes.

The go-zero format keeps metadata in side records (see ``waypost.discovery.formats``); the group
reads that prefix too and ``SideRecords`` joins metadata to addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import _loop, metrics
from ..backoff import COOL_DOWN, cool_down
from ..errors import Compacted, PermissionDenied, RegistryError, RegistryUnavailable, StoreReset
from .container import Container
from .formats import Entry, SideRecords, WireFormat
from .permissions import grant_hint, role_refused
from .stale import StaleStart
from .store import Event, Registry, ValueColumns, Watch

log = logging.getLogger("waypost.discovery")

#: go-zero's RequestTimeout for the Get
GET_TIMEOUT = 3.0


def diff(old: dict[str, bytes], new: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """Keys to delete and keys to add going from ``old`` to ``new``; a changed key is in both."""
    deletes = [k for k, v in old.items() if new.get(k) != v]
    adds = [k for k, v in new.items() if old.get(k) != v]
    return deletes, adds


@dataclass
class _Source:
    """One range the group reads: the main prefix, or the go-zero metadata prefix."""

    key: str
    prefix: bool
    side: bool
    revision: int = 0
    watch: Watch | None = None
    task: asyncio.Task[None] | None = None
    failing: bool = False
    #: etcd key -> (value, mod_revision) of every record read (good or bad)
    raw: dict[str, tuple[bytes, int]] = field(default_factory=dict)


class SharedReader:
    """The shared reader for one (registry, key, exact, format); lives on the control loop."""

    def __init__(self, registry: Registry, key: str, exact: bool, fmt: WireFormat) -> None:
        self.registry = registry
        self.key = key
        self.exact = exact
        self.fmt = fmt
        self.main = _Source(fmt.prefix(key, exact), not exact, False)
        side = None if exact else fmt.side_prefix(key)
        self.side = _Source(side, True, True) if side else None
        # the side records read so far, joined to the main records (none: the format has no side records)
        self.sides = SideRecords(fmt, self.main.key, side or "")
        # The decoded entries (main etcd key -> entry joined with its metadata) as a container:
        # the group compares changes against it, and the non-exclusive subscribers share it.
        self.view = Container(False)
        # main etcd key -> the revision its entry was set at (orders entries for a new container)
        self.revs: dict[str, int] = {}
        # the view was filled in revision order by one bulk add and has not changed since, so a
        # container built afresh from the entries would be the same
        self._view_ordered = True
        self.shared_users = 0  # subscribers reading the view
        self.containers: list[Container] = []  # the exclusive subscribers' own containers
        self.refs = 0
        self.ready: asyncio.Future[None] | None = None
        self.last_error: BaseException | None = None
        self._starter: asyncio.Task[None] | None = None
        self._closed = False
        self.reloads = 0  # how many reloads ran (for tests and stats)
        self.stale = StaleStart(self)  # a stale list while the initial load fails (discovery/stale.py)

    @property
    def sources(self) -> list[_Source]:
        return [self.main] if self.side is None else [self.main, self.side]

    def __repr__(self) -> str:
        return f"<subscription {self.main.key!r} exact={self.exact} format={self.fmt.name} on {self.registry.url}>"

    # -- lifecycle ------------------------------------------------------------------------------

    async def attach(self, exclusive: bool, timeout: float) -> Container:
        """Wait for the initial load (up to ``timeout``), then hand out a container fed from now on."""
        if self.ready is None:
            self.ready = asyncio.get_running_loop().create_future()
            self._starter = asyncio.create_task(self._start(), name=f"waypost-sub-start {self.main.key}")
        try:
            await asyncio.wait_for(asyncio.shield(self.ready), timeout)
        except asyncio.TimeoutError:
            raise RegistryUnavailable(
                f"could not read {self.main.key!r} from {self.registry.url} within {timeout:g}s"
                + (f": {str(self.last_error) or type(self.last_error).__name__}" if self.last_error
                   else ": no answer (is etcd running there?)")
            ) from None
        if not exclusive:
            if self.shared_users == 0 and not self._view_ordered:
                # nobody reads the view: start the new reader from the entries in revision order,
                # as a fresh subscriber sees them (the view's order depends on its history)
                view = Container(False)
                entries = self._ordered_entries()
                with _gc_paused(len(entries)):
                    view.apply((), entries)
                self.view, self._view_ordered = view, True
            self.shared_users += 1
            return self.view
        container = Container(exclusive)
        entries = self._ordered_entries()
        with _gc_paused(len(entries)):
            container.apply((), entries)
        self.containers.append(container)
        return container

    def detach(self, container: Container) -> None:
        if container is self.view:
            self.shared_users -= 1
            return
        try:
            self.containers.remove(container)
        except ValueError:
            pass

    def close(self) -> None:
        self._closed = True
        self.stale.close()
        if self._starter is not None:
            self._starter.cancel()
        for src in self.sources:
            if src.task is not None:
                src.task.cancel()
            if src.watch is not None:
                src.watch.cancel()
        if self.ready is not None and not self.ready.done():
            self.ready.cancel()
        # Drop the caches now rather than when the collector finds the group: its tasks keep it in
        # a reference cycle, and a big set's dicts would otherwise outlive it (RSS grows when a
        # big subscription is closed and opened again).
        self.view, self.containers = Container(False), []
        self.sides.clear()
        self.revs = {}
        for src in self.sources:
            src.raw = {}

    async def _start(self) -> None:
        """The initial load (retried until it works or the group closes), then the watch loops."""
        assert self.ready is not None
        main_read = None
        self.stale.begin()
        try:
            if self.side is not None:
                # both reads at once, the metadata applied first so addresses appear with it
                main_read = asyncio.ensure_future(self._get(self.main))
                await self._load_side()
            try:
                await self._load_until_ok(self.main, initial=True, first=main_read)
            except PermissionDenied as e:
                if not role_refused(e):
                    raise
                raise PermissionDenied(f"{e}; the etcd user needs read permission on {self.main.key!r} "
                                       f"({grant_hint(self.main.key, 'read', self.main.prefix)})") from None
            if self.side is not None and self.main.revision > self.side.revision:
                # something was written between the two reads: a side record written just before
                # its address may be missing, so read the metadata again (a cheap diff)
                await self._load_side()
        except PermissionDenied as e:
            self.stale.live(e)
            return
        finally:
            if main_read is not None:
                # a read that was never used (or still runs) is no news, whatever it ends with
                _loop.abandon(main_read)
        self.stale.live()  # ready: the subscribers' attach returns (unless a stale list made it return)
        for src in self.sources:
            src.task = asyncio.create_task(self._watch_loop(src), name=f"waypost-sub-watch {src.key}")

    # -- without read access to the metadata ----------------------------------------------------

    async def _load_side(self) -> None:
        """Load the metadata prefix; refused (a role that may read only the address prefix, as a
        go-zero deployment grants): go on with the addresses alone."""
        assert self.side is not None
        try:
            await self._load_until_ok(self.side, initial=True)
        except PermissionDenied as e:
            if not role_refused(e):
                raise
            self._drop_side(e)

    def _drop_side(self, e: PermissionDenied) -> None:
        """Read no metadata from now on (said once, at WARNING); addresses lose what they had."""
        side = self.side
        if side is None:
            return
        log.warning("%r: no read permission on the waypost metadata prefix %r, so backends come without "
                    "their metadata (weights, zones...); to use it, grant the etcd user's role: %s (%s)",
                    self, side.key, grant_hint(side.key, "read"), e)
        gone, side.raw = list(side.raw), {}
        if gone:
            self._changed(side, gone, [])
        if side.watch is not None:
            side.watch.cancel()
        self.side = None
        self.sides.clear()

    # -- reading --------------------------------------------------------------------------------

    async def _get(self, src: _Source) -> ValueColumns:
        try:
            return await asyncio.wait_for(self.registry.get_values(src.key, prefix=src.prefix), GET_TIMEOUT)
        except asyncio.TimeoutError:
            raise RegistryUnavailable(f"get of {src.key!r} took longer than {GET_TIMEOUT:g}s") from None

    async def _load(self, src: _Source, read: asyncio.Future[ValueColumns] | None = None) -> None:
        res = await (read if read is not None else self._get(src))
        with _gc_paused(len(res.keys)):
            self.apply_get(src, res)

    def apply_get(self, src: _Source, res: ValueColumns) -> None:
        new = dict(zip(res.keys, zip(res.values, res.mod_revisions)))
        if not src.raw:  # the initial load: everything is an add
            src.raw, src.revision = new, res.revision
            if src is self.main and not self.view:  # the big case: the columns straight to the bulk add
                self._bulk_add(res.keys, res.values, res.mod_revisions, True)
            else:
                self._changed(src, [], list(zip(res.keys, res.mod_revisions)))
            return
        old = src.raw
        deletes, adds = diff({k: v for k, (v, _) in old.items()}, {k: v for k, (v, _) in new.items()})
        src.raw, src.revision = new, res.revision
        self._changed(src, deletes, [(k, new[k][1]) for k in adds])

    async def _load_until_ok(self, src: _Source, initial: bool = False,
                             first: asyncio.Future[ValueColumns] | None = None) -> None:
        """Load ``src`` until it works (``first``: a read already started, used by the first try)."""
        while True:
            read, first = first, None
            try:
                await self._load(src, read)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # unreachable, timeout...: keep the cache, retry
                if isinstance(e, PermissionDenied) and (initial or src.side):
                    # a refusal at start-up will not heal by retrying: fail the subscribers now (or,
                    # for the metadata, go on without it)
                    raise
                self.last_error = e
                if initial:
                    self.stale.failed()
                if not src.failing:
                    src.failing = True
                    # while a subscriber's attach still waits for the initial load, it is told by the
                    # RegistryUnavailable it gets (and its resolver reports that): no second account of it here
                    waiting = initial and self.ready is not None and not self.ready.done()
                    (log.debug if waiting else log.warning)("%r: %s %r failed, retrying every ~%gs: %s", self,
                                "initial load of" if initial else "reload of", src.key, COOL_DOWN, e)
                await asyncio.sleep(cool_down())
                continue
            if src.failing:
                src.failing = False
                log.info("%r: %r loaded again at revision %d", self, src.key, src.revision)
            return

    async def _watch_loop(self, src: _Source) -> None:
        while not self._closed:
            watch = src.watch = self.registry.watch(src.key, prefix=src.prefix, start_revision=src.revision + 1)
            try:
                async for batch in watch:
                    if src is self.main and self.side is not None:
                        await self._fetch_pending_meta(batch)
                    elif src.side:
                        await self._take_out_gone(batch)
                    self._on_events(src, batch)
                    src.revision = max(src.revision, watch.revision)
                if self._closed:
                    return
                raise RegistryError("watch ended")
            except asyncio.CancelledError:
                raise
            except PermissionDenied as e:
                if src.side:  # the metadata: go on without it
                    self._drop_side(e)
                    return
                log.warning("%r: watch of %r refused, reloading: %s", self, src.key, e)
                self.last_error = e
                await asyncio.sleep(cool_down())
            except Compacted as e:
                reset = isinstance(e, StoreReset)  # the registry already warned, once for all watches
                log.log(logging.INFO if reset else logging.WARNING,
                        "%r: watch of %r from revision %d %s (now %d), reloading", self, src.key,
                        src.revision + 1, "outlived its store" if reset else "compacted", e.compact_revision)
                _count_reload(src.key, "reset" if reset else "compacted")
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.warning("%r: watch of %r failed, reloading: %s", self, src.key, e)
                _count_reload(src.key, "error")
                self.last_error = e
                await asyncio.sleep(cool_down())
            finally:
                watch.cancel()
                src.watch = None
            self.reloads += 1
            try:
                await self._load_until_ok(src)
            except PermissionDenied as e:  # the metadata's only (see _load_until_ok)
                self._drop_side(e)
                return

    async def _fetch_pending_meta(self, batch: list[Event]) -> None:
        """Read the side records of new addresses the metadata watch has not caught up with.

        A publisher writes the side record before the address, but the two prefixes are two
        watches and etcd does not order events across watches (a watch created behind the
        current revision catches up later). Without this a weighted or zoned backend would
        appear for a moment without its metadata. Only new ids the side watch has not reached
        cost a read; a Go publisher's address (no side record) costs one empty read.
        """
        side, sides = self.side, self.sides
        assert side is not None
        want = [sides.side_key(ev.kv.key) for ev in batch
                if ev.type == "put" and ev.kv.mod_revision > side.revision
                and not sides.knows(ev.kv.key) and ev.kv.key not in self.main.raw]
        if not want:
            return
        try:
            results = await self._read(want, side.key)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (the side watch still delivers it, later)
            log.debug("%r: reading metadata of %d new addresses failed: %s", self, len(want), e)
            return
        wanted, puts = set(want), []
        for res in results:
            for key, value, rev in zip(res.keys, res.values, res.mod_revisions):
                if key not in wanted:
                    continue
                side.raw[key] = (value, rev)
                puts.append((key, rev))
        if puts:
            self._changed(side, [], puts)

    async def _take_out_gone(self, batch: list[Event]) -> None:
        """Remove at once the addresses that went in the same revision as their deleted side records.

        A stopped publisher's lease revoke deletes its address and side record in one revision,
        but on two watches: when the metadata watch delivers first, the backend would lose its
        metadata and then go (two changes). A deleted side record whose address the address watch
        has not caught up with costs a read of that address; the addresses gone are removed (with
        their metadata: one change) and the address watch's delete is then no news.
        """
        main = self.main
        want = [key for key in (self.sides.main_key(ev.kv.key) for ev in batch
                                if ev.type == "delete" and ev.kv.mod_revision > main.revision)
                if key in main.raw]
        if not want:
            return
        try:
            results = await self._read(want, main.key)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (the address watch still delivers the deletes, later)
            log.debug("%r: reading %d addresses of deleted metadata failed: %s", self, len(want), e)
            return
        present = {key for res in results for key in res.keys}
        gone = [key for key in want if key not in present and main.raw.pop(key, None) is not None]
        if gone:
            self._changed(main, gone, [])

    async def _read(self, keys: list[str], prefix: str) -> list[ValueColumns]:
        """The records at ``keys`` (all under ``prefix``): a read each, or for many (a registration storm) one
        read of the whole prefix rather than thousands."""
        if len(keys) > 32:
            return [await asyncio.wait_for(self.registry.get_values(prefix, prefix=True), GET_TIMEOUT)]
        return await _loop.gather_within(GET_TIMEOUT, *(self.registry.get_values(k) for k in keys))

    def _on_events(self, src: _Source, batch: list[Event]) -> None:
        deletes: list[str] = []
        puts: list[tuple[str, int]] = []
        for ev in batch:
            key = ev.kv.key
            if ev.type == "put":
                src.raw[key] = (ev.kv.value, ev.kv.mod_revision)
                puts.append((key, ev.kv.mod_revision))
            elif src.raw.pop(key, None) is not None:
                deletes.append(key)
        self._changed(src, deletes, puts)

    # -- joining and fan-out --------------------------------------------------------------------

    def _decode_main(self, key: str) -> Entry | None:
        raw = self.main.raw.get(key)
        if raw is None:
            return None
        entry = self.fmt.decode(key, raw[0])
        return entry if entry is None else self.sides.join(key, entry)

    def _changed(self, src: _Source, deletes: list[str], puts: list[tuple[str, int]]) -> None:
        if src.side:
            affected = [(self.sides.delete(key), 0) for key in deletes]
            affected += [(self.sides.put(key, src.raw[key][0]), rev) for key, rev in puts]
            # a metadata change keeps the main record's position (its own mod_revision)
            main_keys = [(k, self.main.raw[k][1]) for k, _ in affected if k in self.main.raw]
            gone = [k for k, _ in affected if k not in self.main.raw]
        else:
            main_keys = sorted(puts, key=_by_revision)
            gone = deletes
            if not self.view and not gone:  # a first batch: the tight loop
                keys = list(dict.fromkeys(k for k, _ in main_keys))  # a key twice: where it came first
                pairs = list(map(self.main.raw.__getitem__, keys))
                self._bulk_add(keys, list(map(_first, pairs)), list(map(_second, pairs)), False)
                return
        view, revs = self.view, self.revs
        # this batch's changes so far, on top of the view (applied to the containers at the end)
        pending: dict[str, Entry | None] = {}
        out_del: list[str] = []
        out_add: list[tuple[str, Entry]] = []
        for key in gone:
            if (pending[key] if key in pending else view.get(key)) is not None:
                pending[key] = None
                revs.pop(key, None)
                out_del.append(key)
        for key, rev in main_keys:
            entry = self._decode_main(key)
            old = pending[key] if key in pending else view.get(key)
            if entry is None:
                if old is not None:
                    pending[key] = None
                    revs.pop(key, None)
                    out_del.append(key)
            elif old is None or old != entry:
                pending[key] = entry
                revs[key] = rev
                out_add.append((key, entry))
        if out_del or out_add:
            self._view_ordered = False
            for c in [view, *self.containers]:
                c.apply(out_del, out_add)

    def _bulk_add(self, keys: list[str], values: list[bytes], revs: list[int], sort: bool) -> None:
        """Decode a batch of distinct main keys (``values`` and ``revs`` their values and
        revisions) and add them to the empty view, the same as the per-key path of ``_changed``
        would, in a few whole-list passes. ``sort``: the batch is in key order (a Get), put it in
        revision order (ties keep key order); else it is in the order to apply already."""
        if not self.sides and not self.containers:
            # the usual big load: bare addresses, no metadata to join, nobody else to feed
            texts = self.fmt.decode_plain(keys, values)
            if texts is not None:
                self.revs = dict(zip(keys, revs))
                if sort and not _ascending(revs):
                    order = sorted(range(len(keys)), key=revs.__getitem__)
                    keys, texts = list(map(keys.__getitem__, order)), list(map(texts.__getitem__, order))
                self.view.bulk_load_plain(keys, texts)
                self._view_ordered = True
                return
        adds = self.fmt.decode_many(keys, values)
        self.revs = dict(zip(keys, revs))
        if len(adds) != len(keys):  # bad records were left out (and logged)
            rev_of = self.revs
            revs = [rev_of[key] for key, _ in adds]
            self.revs = dict(zip(map(_first, adds), revs))
        if sort and not _ascending(revs):  # decoded in key order (the response's order), sorted once here
            adds = list(map(adds.__getitem__, sorted(range(len(adds)), key=revs.__getitem__)))
        if self.sides:  # go-zero metadata already read: join it as _decode_main does
            join = self.sides.join
            adds = [(key, join(key, entry)) for key, entry in adds]
        self.view.apply((), adds)
        self._view_ordered = True
        if adds:
            for c in list(self.containers):
                c.apply((), adds)

    def _ordered_entries(self) -> list[tuple[str, Entry]]:
        """The entries in the order of the revisions they were set at (ties: the order they came)."""
        revs = self.revs
        return sorted(self.view.keys().items(), key=lambda item: revs.get(item[0], 0))


def _ascending(revs: list[int]) -> bool:
    """True when ``revs`` never goes down (a Get whose key order is also its write order)."""
    return all(map(operator.le, revs, itertools.islice(revs, 1, None)))


#: below this many records a load is too small for the collector to matter
GC_PAUSE_MIN = 2_000


@contextlib.contextmanager
def _gc_paused(records: int) -> Iterator[None]:
    """Keep the cyclic collector off while a big batch is turned into entries (no await inside).

    A 10,000-record load allocates ~100,000 container objects; with the collector on, that starts
    collections that walk the older generations, and with a heap of 200,000 objects around (a
    client process) the decode + fill of 10,000 records went from a median of 12 ms paused to
    22 ms with the collector on (best of 80: 11 vs 12.5 ms). The objects form no cycles, so
    pausing frees nothing late.
    """
    if records < GC_PAUSE_MIN or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def _by_revision(kr: tuple[str, int]) -> int:
    return kr[1]


# (registry, key, exact, format) -> group; touched only on the control loop
_groups: dict[tuple[Any, ...], SharedReader] = {}


def _count_reload(key: str, reason: str) -> None:
    obs = metrics.current
    if obs is not None:
        obs.watch_reload(key, reason)


def acquire_reader(registry: Registry, key: str, exact: bool, fmt: WireFormat) -> SharedReader:
    """The process's reader of (registry, key, exact, format), made when none is open; one more reference to it
    (give it back with ``release_reader``)."""
    gk = (registry, key, exact, fmt.name)
    group = _groups.get(gk)
    if group is None or group._closed:
        group = _groups[gk] = SharedReader(registry, key, exact, fmt)
    group.refs += 1
    return group


def release_reader(group: SharedReader, container: Container | None) -> None:
    """Give back a reference from ``acquire_reader`` (and detach ``container`` from it); the last one closes it."""
    if container is not None:
        group.detach(container)
    group.refs -= 1
    if group.refs <= 0:
        gk = (group.registry, group.key, group.exact, group.fmt.name)
        if _groups.get(gk) is group:
            del _groups[gk]
        group.close()


def active_subscriptions() -> list[str]:
    """Descriptions of the shared watches open in this process (for diagnostics and tests)."""
    return [repr(g) for g in _groups.values()]
