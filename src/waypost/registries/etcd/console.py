"""The keyed registries (etcd, memory) on the console (``--registry etcd://...``): one read of the whole keyspace,
then one watch of it, finds the keys (each record's wire format recognised as ``waypost ls`` does) and the override
records; each key is followed by a ``waypost.Subscriber``, the same reader ``waypost watch`` and every client use, so
the console shows what clients see. One subscriber per key, whatever the number of browsers. Lease TTLs are looked
up every few seconds for the leases on screen (bounded). The console's buttons write the override records in the
registry itself (its ``writer``).

Registry calls and subscribers live on waypost's control loop; their results come back to the console's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ... import _loop
from ...console.board import Board, Instance, Service
from ...console.sources import RETRY_INTERVAL, on_control
from ...discovery.connections import connect
from ...discovery.formats import FORMAT_NAMES, GOZERO_META_ROOT
from ...discovery.listing import classify
from ...discovery.override import OVERRIDE_ROOT, parse_override, split_override_key
from ...discovery.store import KeyValue, Registry
from ...discovery.subscriber import Subscriber

log = logging.getLogger("waypost.console")

#: seconds between lease TTL look-ups, and at most this many leases per round
TTL_INTERVAL = 3.0
MAX_TTL_LOOKUPS = 256
#: how long opening one key's subscriber may take
OPEN_TIMEOUT = 5.0
#: at most this many keys are followed per registry (each is one subscriber)
MAX_KEYS = 2000


def _sid(kv_entry: dict[str, Any]) -> tuple[str, str, bool] | None:
    """(subscriber key, format, exact) of a classified record; None for records that are no registration."""
    fmt = kv_entry["format"]
    if kv_entry["address"] is None or fmt not in FORMAT_NAMES:
        return None
    if fmt == "gozero" and kv_entry["id"] == "" and "/" not in kv_entry["key"]:
        return kv_entry["key"], fmt, True  # go-zero's exact-match key
    return kv_entry["service"], fmt, False


class KeyedSource:
    """A keyed registry on the console: ``registry`` a URL of a keyed kind (``waypost.connect``'s) or the
    ``Registry`` itself; ``timeout`` is the registry's own (its URL's ``dial_timeout``)."""

    def __init__(self, registry: str | Registry, board: Board, timeout: float = 5.0, *, writable: bool = True) -> None:
        self.registry = registry = connect(registry) if isinstance(registry, str) else registry
        #: where the console's drain and weight buttons write: the registry's own override records
        self.writer = registry
        self.board = board
        self.name = registry.url
        self.kind = registry.url.split("://", 1)[0]  # the keyed kind's scheme
        self.writable = writable
        self._loop = asyncio.get_running_loop()
        #: record key -> (service id, address, lease), from the keyspace read and watch
        self._records: dict[str, tuple[str, str, int]] = {}
        #: service id -> {record key: (address, lease)}: the same records by service
        self._by_sid: dict[str, dict[str, tuple[str, int]]] = {}
        self._subs: dict[str, Subscriber] = {}
        self._opening: set[str] = set()
        self._tasks: list[asyncio.Task[Any]] = []
        self._watch: Any = None  # the control-loop future of the keyspace watch
        self._closed = False

    # -- start and stop ------------------------------------------------------------------------------

    async def start(self) -> None:
        """One read of the keyspace (bounded by the registry's own timeout), then the watch. A registry that does
        not answer is shown as down, not raised: ``_follow`` reads it again until it answers."""
        rev: int | None = None
        try:
            res = await on_control(self.registry.get("", prefix=True))
        except Exception as e:  # noqa: BLE001 (shown on the page; read again)
            self._unreachable(str(e) or type(e).__name__)
        else:
            self._reload(res.kvs, at_start=True)
            rev = res.revision
        self._watch = _loop.submit(self._follow(rev))
        self._tasks.append(asyncio.create_task(self._ttl_loop(), name="waypost-console-ttl"))

    async def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        for t in self._tasks:
            t.cancel()
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            await sub.aclose()

    # -- the keyspace ----------------------------------------------------------------------------------

    def _reload(self, kvs: Sequence[KeyValue], at_start: bool = False) -> None:
        self._records.clear()
        self._by_sid.clear()
        overrides = {k: v for k, v in self.board.overrides.items() if k[0] != self.name}
        self.board.overrides = overrides
        self._apply([("put", kv) for kv in kvs], at_start)
        gone = [sid for sid in self._subs if not self._by_sid.get(sid)]
        for sid in gone:
            self._drop(sid)
        self.board.source_up(self.name, self.kind)
        self.board.touch()

    def _apply(self, events: Iterable[tuple[str, KeyValue]], at_start: bool = False) -> None:
        touched: set[str] = set()
        puts: list[KeyValue] = []
        for kind, kv in events:
            key = kv.key
            if key.startswith(OVERRIDE_ROOT):
                self._override(kind, kv)
                continue
            if key.startswith(("_waypost/", GOZERO_META_ROOT)):
                continue
            if kind == "delete":
                gone = self._forget(key)
                if gone is not None:
                    touched.add(gone)
                continue
            puts.append(kv)
        for e, kv in zip(classify(puts), puts, strict=True):
            sid = _sid(e)
            if sid is None:
                self._forget(kv.key)
                continue
            sid_text = f"{self.name}|{sid[1]}|{sid[0]}"
            was = self._forget(kv.key)  # (a record may change service: a value of another format)
            if was is not None and was != sid_text:
                touched.add(was)
            self._records[kv.key] = (sid_text, e["address"], kv.lease)
            self._by_sid.setdefault(sid_text, {})[kv.key] = (e["address"], kv.lease)
            touched.add(sid_text)
            if sid_text not in self._subs and sid_text not in self._opening and len(self._subs) < MAX_KEYS:
                self._opening.add(sid_text)
                self._tasks.append(asyncio.create_task(self._open(sid_text, *sid, at_start)))
        for sid_text in touched:
            if not self._by_sid.get(sid_text):
                self._drop(sid_text)
            elif sid_text in self._subs:
                self._refresh(sid_text)

    def _forget(self, record_key: str) -> str | None:
        """Drop a record; returns the service id it belonged to (None: not known)."""
        gone = self._records.pop(record_key, None)
        if gone is None:
            return None
        records = self._by_sid.get(gone[0])
        if records is not None:
            records.pop(record_key, None)
            if not records:
                del self._by_sid[gone[0]]
        return gone[0]

    def _override(self, kind: str, kv: KeyValue) -> None:
        parts = split_override_key(kv.key)
        if parts is None:
            return
        o = parse_override(kv.value) if kind == "put" else None
        if o is None:
            self.board.overrides.pop((self.name, parts[0], parts[1]), None)
        else:
            self.board.overrides[(self.name, parts[0], parts[1])] = o
        self.board.touch()

    async def _follow(self, rev: int | None) -> None:
        """On the control loop: watch the whole keyspace from ``rev``; after a failure (or with no ``rev``: never
        read yet) read it again, every ``RETRY_INTERVAL`` s until it answers."""
        first = rev is None
        while not self._closed:
            if rev is None:
                try:
                    res = await self.registry.get("", prefix=True)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 (shown on the page; read again)
                    self._loop.call_soon_threadsafe(self._unreachable, str(e) or type(e).__name__)
                    await asyncio.sleep(RETRY_INTERVAL)
                    continue
                rev = res.revision
                self._loop.call_soon_threadsafe(self._reload, list(res.kvs), first)
                first = False
            watch = self.registry.watch("", prefix=True, start_revision=rev + 1)
            try:
                async for batch in watch:
                    rev = max(rev, watch.revision)
                    events = [(ev.type, ev.kv) for ev in batch]
                    self._loop.call_soon_threadsafe(self._apply, events)
                raise ConnectionError("the watch ended")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the console shows the registry's state instead)
                self._loop.call_soon_threadsafe(self._unreachable, str(e) or type(e).__name__)
                await asyncio.sleep(RETRY_INTERVAL)
                rev = None
            finally:
                watch.cancel()

    def _unreachable(self, why: str) -> None:
        self.board.source_down(self.name, self.kind, why)

    # -- one key: its subscriber ----------------------------------------------------------------------------

    async def _open(self, sid_text: str, key: str, fmt: str, exact: bool, at_start: bool) -> None:
        try:
            sub = await Subscriber.open(self.registry, key, exact, fmt, timeout=OPEN_TIMEOUT)
        except Exception as e:  # noqa: BLE001 (shown on the page; the next record of this key tries again)
            log.warning("console: cannot follow %r (%s) in %s: %s", key, fmt, self.name, e)
            return
        finally:
            self._opening.discard(sid_text)
        if self._closed:
            await sub.aclose()
            return
        self._subs[sid_text] = sub
        self.board.services[sid_text] = Service(self.name, key, fmt, self.writable, exact)
        sub.add_listener(lambda: self._post(self._refresh, sid_text))
        self._refresh(sid_text, at_start)

    def _post(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the console's loop (from the control loop's thread)."""
        self._loop.call_soon_threadsafe(fn, *args)

    def _refresh(self, sid_text: str, at_start: bool = False) -> None:
        sub, svc = self._subs.get(sid_text), self.board.services.get(sid_text)
        if sub is None or svc is None:
            return
        now = time.time()
        leases = dict(self._by_sid.get(sid_text, {}).values())
        seen = {}
        for b in sub.backends():
            old = svc.instances.get(b.address)
            inst = old or Instance(b.address, {}, now, at_start)
            inst.metadata = dict(b.metadata)
            lease = leases.get(b.address, inst.lease)
            if lease != inst.lease:
                inst.lease, inst.ttl = lease, None
            seen[b.address] = inst
        svc.instances = seen
        self.board.touch()

    def _drop(self, sid_text: str) -> None:
        sub = self._subs.pop(sid_text, None)
        self.board.services.pop(sid_text, None)
        if sub is not None:
            _loop.submit(sub.aclose())
        self.board.touch()

    # -- lease TTLs --------------------------------------------------------------------------------------

    async def _ttl_loop(self) -> None:
        while not self._closed:
            leases = sorted({i.lease for sid in self._subs if (s := self.board.services.get(sid))
                             for i in s.instances.values() if i.lease})[:MAX_TTL_LOOKUPS]
            if leases:
                try:
                    got = await on_control(_loop.gather_within(TTL_INTERVAL, *(
                        self.registry.time_to_live(lease) for lease in leases)))
                except Exception as e:  # noqa: BLE001 (the next round tries again)
                    log.debug("console: lease TTLs from %s: %s", self.name, e)
                else:
                    now = time.time()
                    ttl = dict(zip(leases, got, strict=True))
                    for sid in self._subs:
                        for i in self.board.services[sid].instances.values() if sid in self.board.services else ():
                            if i.lease in ttl:
                                i.ttl, i.ttl_at = int(ttl[i.lease]), now
                    self.board.touch()
            await asyncio.sleep(TTL_INTERVAL)
