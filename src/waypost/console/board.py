"""The console's one shared picture of every service, instance and client, on the console's event loop.

Sources (registries, resolver targets, health probes, client metrics) write into the ``Board``; every browser
reads the same snapshot. A change bumps ``version`` and wakes the event streams, which coalesce bursts: many
changes in a moment are one message per browser, and nothing reads a registry per browser.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from ..balancer.weights import weight_of

log = logging.getLogger("waypost.console")


@dataclass
class Instance:
    address: str
    metadata: dict[str, Any]
    first_seen: float
    at_start: bool  # present when the console started (its age is at least first_seen's)
    lease: int = 0
    ttl: int | None = None  # seconds left at ttl_at (None: no lease known, or not looked up yet)
    ttl_at: float = 0.0

    def effective_weight(self) -> int:
        """The weight every weight-aware policy uses for this registration (0: drained)."""
        return weight_of(self.metadata)[0]


@dataclass
class Service:
    source: str  # the registry URL (passwords hidden) or the target followed
    key: str
    format: str
    writable: bool  # drain and weight act on it (a keyed registry, or a kind's override store)
    exact: bool = False
    instances: dict[str, Instance] = field(default_factory=dict)
    error: str | None = None

    @property
    def id(self) -> str:
        return f"{self.source}|{self.format}|{self.key}"


@dataclass
class Health:
    status: str  # SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN, UNREACHABLE, UNIMPLEMENTED, ...
    at: float
    detail: str = ""


@dataclass
class SourceState:
    """Whether a registry can be read now: ``error`` is why not (None: it can), ``since`` when that began (the
    first failure of an outage, or the read that ended one; the console's start until its first answer)."""

    kind: str  # the registry's scheme
    error: str | None
    since: float
    read: bool = False  # read at least once (False: the page has never had its list)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "error": self.error, "since": self.since, "read": self.read}


class Board:
    def __init__(self) -> None:
        self.started = time.time()
        self.services: dict[str, Service] = {}
        #: (source, key, address) -> the override record's JSON (also those of no instance now)
        self.overrides: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.health: dict[str, Health] = {}
        #: metrics URL -> {"error": str|None, "targets": {target: {"backends": {...}, "series": [...]}}}
        self.clients: dict[str, dict[str, Any]] = {}
        #: registry name -> whether it can be read now (``source_down`` / ``source_up``)
        self.sources: dict[str, SourceState] = {}
        self.version = 0
        self.closed = False  # set when the console stops: event streams end
        self._changed = asyncio.Event()

    def touch(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, seen: int, timeout: float) -> int:
        """Wait (at most ``timeout`` s) until ``version`` differs from ``seen``; returns the version now."""
        if self.version == seen:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version

    def source_down(self, name: str, kind: str, why: str) -> None:
        """``name`` cannot be read (``why``): shown on the page from the first failure on, until ``source_up``."""
        now = time.time()
        state = self.sources.get(name)
        if state is None or state.error is None:
            log.warning("console: %s unreachable: %s (shown as down; tried again until it answers)", name, why)
            self.sources[name] = SourceState(kind, why, now, state.read if state else False)
        elif state.error != why:
            log.info("console: %s still unreachable: %s", name, why)
            state.error = why  # the same outage: ``since`` stays
        else:
            return
        self.touch()

    def source_up(self, name: str, kind: str) -> None:
        """``name`` answered: clears a ``source_down`` (logged: it recovered)."""
        state = self.sources.get(name)
        if state is not None and state.error is None and state.read:
            return
        if state is not None and state.error is not None:
            log.warning("console: %s answers again (down since %s)", name,
                        time.strftime("%H:%M:%S", time.localtime(state.since)))
        self.sources[name] = SourceState(kind, None, time.time(), True)
        self.touch()

    def addresses(self) -> set[str]:
        return {a for s in self.services.values() for a in s.instances}

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        services = []
        for s in sorted(self.services.values(), key=lambda s: (s.key, s.source, s.format)):
            items = []
            for i in sorted(s.instances.values(), key=lambda i: i.address):
                h = self.health.get(i.address)
                o = self.overrides.get((s.source, s.key, i.address))
                ttl = None if i.ttl is None else max(-1, round(i.ttl - (now - i.ttl_at)))
                items.append({
                    "address": i.address, "metadata": i.metadata, "weight": i.effective_weight(),
                    "override": o, "lease": i.lease or None, "ttl": ttl,
                    "age": round(now - i.first_seen, 1), "age_at_least": i.at_start,
                    "health": h.status if h else None, "health_detail": h.detail if h else "",
                    "health_age": round(now - h.at, 1) if h else None,
                })
            services.append({"id": s.id, "source": s.source, "key": s.key, "format": s.format,
                             "writable": s.writable, "exact": s.exact, "error": s.error, "instances": items})
        live = {(s.source, s.key, a) for s in self.services.values() for a in s.instances}
        orphans = [{"source": src, "key": k, "address": a, **o}
                   for (src, k, a), o in sorted(self.overrides.items()) if (src, k, a) not in live]
        return {"version": self.version, "time": now, "started": self.started, "services": services,
                "orphan_overrides": orphans, "sources": {n: st.as_json() for n, st in self.sources.items()},
                "clients": self.clients}
