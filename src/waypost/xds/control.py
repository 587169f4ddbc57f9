"""The control plane: exports -> sources -> snapshots -> every ADS stream.

``ControlPlane(exports, prefixes)`` starts one resolver per export and serves ADS on ``listen``. It runs on
waypost's control loop (``waypost._loop``): the resolvers already deliver their lists there (or hop there
first), so building a snapshot and queueing the pushes happen on one thread with no lock, and the
process needs no thread of its own for the control plane. A push is cheap (the resources of a changed
service are built once, and the response bytes once per distinct subscription), so it never holds the
loop long.

Endpoint lists are kept with care:

- **an empty list never replaces a non-empty one**: a registry outage, a wiped store or an empty answer (or one
  with no usable entry: host names are left out) keeps the last endpoints served (a logged warning says so). Clients fail over between the endpoints they
  have; the registration that disappears for good is dropped by the next non-empty list;
- a service whose source answered, but never with an endpoint, is served with an empty assignment
  (``serve_empty``, the default), so its calls fail at once with UNAVAILABLE rather than waiting for the
  client's 15 s does-not-exist timer; with ``serve_empty=false`` it is left unanswered until it has one;
- a service whose source has not answered at all gets its Listener, Route and Cluster but no assignment
  yet (clients wait for it, up to their own timeout).

A source that fails (its registry unreachable...) is logged once when it goes down, naming the export, the
cause and what stays served (nothing yet, an empty assignment, or its last N endpoints), and once when it is
back; the failures in between are DEBUG lines, and the resolvers themselves stay quiet
(``ResolverOptions(quiet=True)``). ``waypost_xds_source_up{export}`` is 1 or 0 accordingly (``metrics``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from .. import _loop
from .. import metrics as _metrics
from ..resolver import Resolver
from ..types import Backend
from .errors import XdsConfigError
from .exports import Export, PrefixExport, check_unique, make_export
from .load_stats import LoadStats
from .lrs import DEFAULT_INTERVAL, LoadCollector, LrsServer, check_interval
from .resources import (
    CLUSTER,
    ENDPOINT,
    ROUTE,
    SHORT,
    TYPES,
    load_assignment,
    route_config,
    static_resources,
    subset_assignments,
    subset_clusters,
)
from .server import AdsServer
from .snapshot import Resource, Snapshot
from .sources import PrefixWatcher, start_source
from .traffic import describe, empty_subsets

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("waypost.xds")
#: the shortest time between two pushes (seconds): a change after a quiet spell goes out at once, a burst of
#: changes folds into one push per interval (Istio debounces 100 ms after the last change, up to 10 s; leading
#: edge plus this bound keeps a single change's latency at the push itself)
PUSH_INTERVAL = 0.1


class ControlPlane:
    """Serves ``exports`` (and services found under ``prefixes``) over ADS (module docstring).

    ``start(listen)`` returns the bound port; ``stop()`` ends it. Thread-safe entry points: ``start``, ``stop``,
    ``add_export``, ``replace_exports``; everything else runs on the control loop."""

    def __init__(self, exports: Iterable[Export] = (), prefixes: Iterable[PrefixExport] = (), *,
                 prefix_interval: float = 2.0, push_interval: float = PUSH_INTERVAL,
                 max_connection_age: float | None = None, clock: Callable[[], float] = time.monotonic,
                 load_reporting_interval: float = DEFAULT_INTERVAL, engine: str = "python") -> None:
        self.max_connection_age = max_connection_age
        if not push_interval >= 0:
            raise XdsConfigError(f"push_interval must be a number of seconds >= 0, got {push_interval!r}")
        self.push_interval = push_interval
        self._clock = clock
        self._last_push = float("-inf")
        self._pending: asyncio.Handle | None = None
        self._marked_at: float | None = None  # when the first change not pushed yet came
        self.exports: dict[str, Export] = {}
        self.prefixes = tuple(prefixes)
        self.prefix_interval = prefix_interval
        self._static: dict[str, dict[str, Resource]] = {}
        self._eds: dict[str, Resource] = {}
        # an export's subsets (traffic.py): their Clusters and assignments by cluster name, and the subsets with
        # no endpoint now (left out of the export's splits)
        self._subset_clusters: dict[str, dict[str, Resource]] = {}
        self._subset_eds: dict[str, dict[str, Resource]] = {}
        self._empty: dict[str, frozenset[str]] = {}
        self._found: set[str] = set()  # exports found under prefixes (replace_exports leaves them)
        self._generation: dict[str, int] = {}  # per export: its source's generation (a replaced one's updates are dropped)
        self._lists: dict[str, tuple[Backend, ...]] = {}
        self._usable: dict[str, int] = {}  # endpoints in the assignment served (host names are left out)
        self._down: dict[str, str] = {}  # export -> the failure its source reported last (while it fails)
        self._resolvers: dict[str, Resolver] = {}
        self._watchers: list[PrefixWatcher] = []
        self._snapshot = Snapshot.empty()
        self._dirty = False
        if engine not in ("python", "native"):
            raise XdsConfigError(f"engine must be 'python' or 'native', got {engine!r}")
        if engine == "native":  # the streams served by the Rust engine (native_engine.py): the rest is the same
            from .native_engine import NativeAdsServer

            self.ads: AdsServer | NativeAdsServer = NativeAdsServer()
        else:
            self.ads = AdsServer(lambda: self._snapshot)
        #: what the clients of load-reporting exports report (LRS, ``lrs.py``), on the same server
        try:
            interval = check_interval(load_reporting_interval)
        except ValueError as bad:
            raise XdsConfigError(str(bad)) from None
        self.load = LoadStats(interval, self.export_of)
        if isinstance(self.ads, AdsServer):  # the Rust engine serves ADS alone: no load reports there
            self.ads.services.append(LrsServer(self.load, self._reporting_clusters).add_to_server)
        self._load_collector = LoadCollector(self.load)
        self._load_registry: CollectorRegistry | None = None  # the Prometheus registry it is in
        #: figures: snapshots built, the last push's duration (seconds) and response count
        self.stats: dict[str, Any] = {"snapshots": 0, "last_push_seconds": 0.0, "last_push_responses": 0}
        self._started = False
        for e in exports:
            if e.name in self.exports:
                raise XdsConfigError(f"export {e.name!r} is given twice")
            self.exports[e.name] = e

    # ------------------------------------------------------------------ lifecycle (any thread)

    @property
    def port(self) -> int:
        return self.ads.port

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def start(self, listen: str = "127.0.0.1:0", credentials: grpc.ServerCredentials | None = None,
              timeout: float = 30.0, *, reuse_port: bool = False) -> int:
        return _loop.run(self.astart(listen, credentials, reuse_port=reuse_port), timeout)

    async def astart(self, listen: str, credentials: grpc.ServerCredentials | None = None, *,
                     reuse_port: bool = False) -> int:
        """On the control loop: start the sources and the ADS server; returns the port."""
        for e in list(self.exports.values()):
            self._add(e)
        for p in self.prefixes:
            w = PrefixWatcher(p.registry, p.prefix, self._prefix_found(p), self.prefix_interval)
            self._watchers.append(w)
            w.start()
        self._rebuild()
        registry = _metrics.prometheus_registry()  # metrics enabled before the start (waypost xds serve does)
        if registry is not None and self._load_registry is None:
            registry.register(self._load_collector)
            self._load_registry = registry
        port = await self.ads.start(listen, credentials, reuse_port=reuse_port,
                                    max_connection_age=self.max_connection_age)
        self._started = True
        log.info("xds: serving %d export(s) on port %d", len(self.exports), port)
        return port

    def stop(self, grace: float = 1.0) -> None:
        if not _loop.in_loop():
            _loop.run(self.astop(grace), grace + 10)

    async def astop(self, grace: float = 1.0) -> None:
        for w in self._watchers:
            w.stop()
        for r in list(self._resolvers.values()):
            try:
                await r.aclose()
            except Exception:
                log.debug("xds: closing a resolver failed", exc_info=True)
        self._resolvers.clear()
        await self.ads.stop(grace)
        if self._load_registry is not None:
            self._load_registry.unregister(self._load_collector)
            self._load_registry = None
        self._started = False

    def add_export(self, export: Export) -> None:
        """Serve one more export (from any thread; returns once it is in the snapshot); a name already exported
        is kept as it is."""
        if _loop.in_loop():
            self._add_checked(export)
        else:
            _loop.run(self._aadd(export), 30)

    async def _aadd(self, export: Export) -> None:
        self._add_checked(export)

    def _add_checked(self, export: Export) -> None:
        old = self.exports.get(export.name)
        if old is not None and export.name in self._resolvers:
            if old != export:
                log.error("xds: export %r already exists with another definition; keeping the first", export.name)
            return
        self.exports[export.name] = export
        self._add(export)
        self._rebuild()  # add_export returns with it served: no pacing for this one

    def replace_exports(self, exports: Iterable[Export]) -> None:
        """Serve ``exports`` instead of the exports served so far (from any thread; returns once the new snapshot
        is built): those found under prefixes stay; an export whose target did not change keeps its source and
        its endpoints (only its resources are rebuilt, and only if its definition changed); the others' sources
        are started or stopped. Equal definitions change nothing (no push)."""
        new = list(exports)
        check_unique(new)
        if _loop.in_loop():
            self._replace(new)
        else:
            _loop.run(self._areplace(new), 30)

    async def _areplace(self, exports: list[Export]) -> None:
        self._replace(exports)

    def _replace(self, exports: list[Export]) -> None:
        wanted = {e.name: e for e in exports}
        if not self._started:  # astart starts what is in self.exports
            self.exports = {**{n: e for n, e in self.exports.items() if n in self._found}, **wanted}
            return
        changed = False
        for name in [n for n in self.exports if n not in wanted and n not in self._found]:
            self._remove(name)
            log.info("xds: export %r removed", name)
            changed = True
        for e in exports:
            old = self.exports.get(e.name)
            self._found.discard(e.name)
            if old == e and e.name in self._resolvers:
                continue
            changed = True
            if old is not None and old.target == e.target and e.name in self._resolvers:
                self.exports[e.name] = e
                self._build_static(e)
                self._reassign(e)
                log.info("xds: export %r changed (same source)", e.name)
            else:
                if old is not None:
                    self._remove(e.name)
                self.exports[e.name] = e
                self._add(e)
                log.info("xds: export %r %s", e.name, "added" if old is None else "changed (new source)")
        if changed:
            self._rebuild()  # replace_exports returns with the new config served: no pacing for this one

    def _remove(self, name: str) -> None:
        """Stop serving ``name``: its source is closed (its late updates are dropped) and its resources go."""
        self._generation[name] = self._generation.get(name, 0) + 1
        resolver = self._resolvers.pop(name, None)
        if resolver is not None:
            task = asyncio.get_running_loop().create_task(resolver.aclose())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: a failed close is moot
        for table in (self.exports, self._static, self._eds, self._lists, self._usable, self._down,
                      self._subset_clusters, self._subset_eds, self._empty):
            table.pop(name, None)

    def _prefix_found(self, p: PrefixExport) -> Callable[[str, str], None]:
        def found(service: str, target: str) -> None:
            if service in self.exports:
                return
            try:
                export = make_export(service, target, p.options, f"prefix {p.prefix!r}: {service!r}")
            except XdsConfigError as e:
                log.error("xds: %s", e)
                return
            self._found.add(service)
            self._add_checked(export)

        return found

    # ------------------------------------------------------------------ sources (control loop)

    def _add(self, export: Export) -> None:
        self._build_static(export)
        generation = self._generation[export.name] = self._generation.get(export.name, 0) + 1
        self._resolvers[export.name] = start_source(
            export, lambda name, backends: self._on_update(name, backends, generation),
            lambda name, message: self._on_error(name, message, generation))

    def _build_static(self, export: Export) -> None:
        """The export's Listener, Route and Cluster, and its subsets' Clusters (the splits as configured until
        its endpoints show which subsets are empty)."""
        self._static[export.name] = {t: Resource.of(export.name, m) for t, m in static_resources(export).items()}
        self._subset_clusters[export.name] = {n: Resource.of(n, c) for n, c in subset_clusters(export).items()}
        self._subset_eds.pop(export.name, None)
        self._empty[export.name] = frozenset()

    def _on_update(self, name: str, backends: Sequence[Backend], generation: int | None = None) -> None:
        if _loop.in_loop():
            self._update(name, tuple(backends), generation)
        else:
            _loop.call_soon(self._update, name, tuple(backends), generation)

    def _on_error(self, name: str, message: str, generation: int | None = None) -> None:
        if _loop.in_loop():
            self._failed(name, message, generation)
        else:
            _loop.call_soon(self._failed, name, message, generation)

    def _current(self, name: str, generation: int | None) -> Export | None:
        """The export ``name``, unless the update comes from a source it no longer has (``_remove``)."""
        if generation is not None and self._generation.get(name) != generation:
            return None
        return self.exports.get(name)

    def _failed(self, name: str, message: str, generation: int | None = None) -> None:
        """The source of ``name`` failed: one WARNING when it goes down, DEBUG while it stays down."""
        export = self._current(name, generation)
        if export is None:
            return
        was_down = name in self._down
        self._down[name] = message
        if was_down:
            log.debug("xds: source of %r still failing: %s", name, message)
            return
        log.warning("xds: source of %r (%s) is down: %s; %s", name, _target_text(export), message,
                    self._served_text(name))
        _gauge(name, up=False)

    def _served_text(self, name: str) -> str:
        """What clients get for ``name`` while its source is down, in words."""
        old = self._lists.get(name)
        if old is None:
            return "it has had no endpoints yet: clients wait for them"
        if not old:
            return ("it never had endpoints: its empty assignment stays served (calls fail at once)" if name in self._eds
                    else "it never had endpoints: clients wait for them")
        return f"its last {self._usable.get(name, len(old))} endpoint(s) stay served"

    def _back(self, name: str, backends: tuple[Backend, ...]) -> None:
        if self._down.pop(name, None) is not None:
            log.warning("xds: source of %r is back: %d endpoint(s)", name, len(backends))
        _gauge(name, up=True)

    def _update(self, name: str, backends: tuple[Backend, ...], generation: int | None = None) -> None:
        export = self._current(name, generation)
        if export is None:
            return
        self._back(name, backends)
        old = self._lists.get(name)
        if not backends:
            if old:
                log.warning("xds: source of %r answered with no endpoint; keeping its last %d (an empty "
                            "assignment is never pushed over one with endpoints)", name, len(old))
                return
            if not export.serve_empty or (old is not None and name in self._eds):
                self._lists[name] = ()
                return
        if old is not None and _same(old, backends):
            return
        cla = load_assignment(export, backends)
        usable = sum(len(loc.lb_endpoints) for loc in cla.endpoints)
        if backends and not usable and self._usable.get(name):
            log.warning("xds: no usable endpoint in the new list of %r (%d entries); keeping its last %d",
                        name, len(backends), self._usable[name])
            return
        self._lists[name] = backends
        self._usable[name] = usable
        self._eds[name] = Resource.of(name, cla)
        self._assign_subsets(export, backends)
        log.info("xds: %s: %d endpoint(s)", name, usable)
        self._mark()

    def _reassign(self, export: Export) -> None:
        """After a change of the export's definition: its assignments again, from the list it is served now."""
        name = export.name
        if name not in self._eds:
            return
        backends = self._lists.get(name, ())
        self._eds[name] = Resource.of(name, load_assignment(export, backends))
        self._assign_subsets(export, backends)

    def _assign_subsets(self, export: Export, backends: Sequence[Backend]) -> None:
        """The subsets' assignments from ``backends``; when the set of empty subsets changes, the route
        (they are left out of the splits while empty: traffic.py) and one log line."""
        name = export.name
        if not export.subsets:
            return
        parts = subset_assignments(export, backends)
        self._subset_eds[name] = {cla.cluster_name: Resource.of(cla.cluster_name, cla) for cla, _ in parts.values()}
        empty = empty_subsets(export, {n: live for n, (_, live) in parts.items()})
        before = self._empty.get(name, frozenset())
        if empty == before:
            return
        self._empty[name] = empty
        self._static[name][ROUTE] = Resource.of(name, route_config(export, empty))
        if empty - before:
            log.warning("xds: %s: subset(s) %s have no endpoint: left out of the splits until they have one (their "
                        "share goes to the split's other subsets, or to the whole cluster %s when none is left)",
                        name, describe(sorted(empty - before)), name)
        if before - empty:
            log.warning("xds: %s: subset(s) %s have endpoints again: back in the splits", name,
                        describe(sorted(before - empty)))

    def _mark(self) -> None:
        """Rebuild for the changes queued: at once when the last push is ``push_interval`` old or more, else at
        that moment, so a single change is pushed without delay and a burst makes at most one push per
        interval (every change meanwhile folds into it; none waits longer than the interval)."""
        if self._dirty:
            return
        self._dirty = True
        self._marked_at = self._clock()
        loop = asyncio.get_running_loop()
        wait = self._last_push + self.push_interval - self._clock()
        self._pending = loop.call_later(wait, self._rebuild) if wait > 0 else loop.call_soon(self._rebuild)

    def _rebuild(self) -> None:
        """Build the snapshot of every change so far and push it (also at once, for ``add_export``, which returns
        with its export served: a push scheduled for later then has nothing left to do)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._dirty = False
        self._last_push = self._clock()
        started = time.perf_counter()
        per_type: dict[str, dict[str, Resource]] = {t: {} for t in TYPES}
        for name, static in self._static.items():
            for t, r in static.items():
                per_type[t][name] = r
            if name in self._eds:
                per_type[ENDPOINT][name] = self._eds[name]
            per_type[CLUSTER].update(self._subset_clusters.get(name, {}))
            per_type[ENDPOINT].update(self._subset_eds.get(name, {}))
        snap = Snapshot(per_type)
        changed = _changed_names(self._snapshot, snap)
        self._snapshot = snap
        queued = self.ads.push(snap, changed)
        took = time.perf_counter() - started
        self.stats.update(snapshots=self.stats["snapshots"] + 1, last_push_seconds=took, last_push_responses=queued)
        obs = _metrics.current
        if obs is not None:
            for t, n in snap.count().items():
                obs.xds_resources(SHORT[t], n)
            if self._marked_at is not None:
                obs.xds_pushed(max(self._clock() - self._marked_at, 0.0))
        self._marked_at = None
        if queued:
            log.debug("xds: snapshot pushed: %d response(s) in %.1f ms", queued, took * 1000)

    # ------------------------------------------------------------------ inspection

    def export_of(self, cluster: str) -> str:
        """The export a cluster name belongs to: its own name, or the export of a subset's ``NAME/KEY=VALUE``."""
        if cluster in self.exports:
            return cluster
        return next((name for name, subsets in self._subset_clusters.items() if cluster in subsets), cluster)

    def _reporting_clusters(self) -> list[str]:
        """The clusters whose clients report load, served now."""
        names = []
        for name in self._snapshot.names(CLUSTER):
            export = self.exports.get(self.export_of(name))
            if export is not None and export.load_reporting:
                names.append(name)
        return sorted(names)

    def endpoints(self, name: str) -> tuple[Backend, ...] | None:
        """The endpoints served for ``name`` now (None: its source has not answered)."""
        return self._lists.get(name)


def _gauge(name: str, *, up: bool) -> None:
    obs = _metrics.current
    if obs is not None:
        obs.xds_source(name, up)


def _target_text(export: Export) -> str:
    """The export's target(s) as logged: credentials left out (``Target.redacted``)."""
    from ..resolver.target import parse_target

    targets = [export.target] if isinstance(export.target, str) else list(export.target)
    return ", ".join(parse_target(t).redacted for t in targets)


def _changed_names(old: Snapshot, new: Snapshot) -> dict[str, set[str]]:
    """Per type, the names whose resource was added, changed or removed from ``old`` to ``new`` (resources
    of unchanged services are the same objects: compared by identity first, by digest otherwise)."""
    out: dict[str, set[str]] = {}
    for t in TYPES:
        a, b = old.names(t), new.names(t)
        names = {n for n, r in b.items() if (o := a.get(n)) is not r and (o is None or o.digest != r.digest)}
        names.update(n for n in a if n not in b)
        out[t] = names
    return out


def _same(a: tuple[Backend, ...], b: tuple[Backend, ...]) -> bool:
    """The same backends with the same metadata, in any order."""
    if len(a) != len(b):
        return False  # the common change (one more, one fewer) without sorting a big list
    if a == b:
        return True
    key = lambda bs: sorted((x.address, sorted((str(k), str(v)) for k, v in x.metadata.items())) for x in bs)
    return key(a) == key(b)
