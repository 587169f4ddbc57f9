"""Operator overrides of a registration's weight: the record layout, and the watch a publisher keeps on its own.

An operator (``waypost drain``, the web console) writes one record per service key and address::

    _waypost/override/<key>/<address>  ->  {"weight": 0, "by": "127.0.0.1", "at": 1767312000.5}

with no lease: it stays until it is deleted (``waypost undrain``), also across restarts of the instance.
``<key>`` is the key the publisher was given (the service name for Kratos), ``<address>`` the address it
registers. The ``Publisher`` of that key and address follows the record (a get, then a watch, kept up
across etcd failures) and registers its metadata with ``weight`` replaced by the override's, so everyone
reading the registration sees the new weight, and the publisher's guard puts back *that* metadata.
Deleting the record gives the registration its own metadata back.

Only ``weight`` is taken from the record; ``by`` and ``at`` say who wrote it and when (Unix time), for
people. A record that is no JSON object with a non-negative integer ``weight`` is ignored (logged once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..backoff import cool_down
from ..errors import PermissionDenied
from .store import Registry

log = logging.getLogger("waypost.discovery")

OVERRIDE_ROOT = "_waypost/override/"
#: bounded pause after a failed read or watch of the override record
RETRY_INTERVAL = 1.0


def override_key(key: str, address: str) -> str:
    """Where the override of ``address`` registered under ``key`` lives."""
    return f"{OVERRIDE_ROOT}{key}/{address}"


def split_override_key(record_key: str) -> tuple[str, str] | None:
    """``(key, address)`` of an override record's key; None for any other key."""
    if not record_key.startswith(OVERRIDE_ROOT):
        return None
    key, sep, address = record_key[len(OVERRIDE_ROOT):].rpartition("/")
    return (key, address) if sep and key and address else None


def encode_override(weight: int, by: str, at: float) -> bytes:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise ValueError(f"an override weight is a whole number >= 0, got {weight!r}")
    return json.dumps({"weight": weight, "by": by, "at": round(at, 3)}, sort_keys=True).encode()


def parse_override(value: bytes) -> dict[str, Any] | None:
    """The record as a dict with an int ``weight`` >= 0, or None when it is not a valid override."""
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    w = doc.get("weight")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 or w != int(w):
        return None
    return {**doc, "weight": int(w)}


def apply_override(metadata: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metadata to register: ``metadata`` with ``weight`` from ``override`` (unchanged without one)."""
    if override is None:
        return dict(metadata) if metadata else None
    return {**(metadata or {}), "weight": override["weight"]}


def shown_record(current: dict[str, Any] | None) -> str:
    """How a log line names the override in force."""
    if current is None:
        return "removed: the registration carries its own metadata again"
    return f"weight {current['weight']} (set by {current.get('by', '?')})"


def take_record(follower: Any, value: bytes | None) -> bool:
    """Make ``value`` (the record's bytes; None: no record) the follower's ``current``; True when the weight
    in force changed (who and when alone change nothing). A bad record counts as none, logged once."""
    new = None if value is None else parse_override(value)
    if value is not None and new is None and not follower._bad_logged:
        follower._bad_logged = True
        log.warning("ignoring the override record %r: not a JSON object with a whole weight >= 0: %r",
                    follower.key, value[:200])
    old = None if follower.current is None else follower.current["weight"]
    follower.current = new
    return old != (None if new is None else new["weight"])


class OverrideFollower:
    """Follows one override record on the control loop: ``read()`` once (before a registration), then
    ``run()`` as a task, calling ``on_change()`` after each change of ``current``."""

    def __init__(self, registry: Registry, key: str, address: str, on_change: Callable[[], Awaitable[None]],
                 rng: random.Random) -> None:
        self.registry = registry
        self.key = override_key(key, address)
        self.current: dict[str, Any] | None = None
        self._on_change = on_change
        self._rng = rng
        self._revision = 0
        self._denied = False
        self._bad_logged = False

    async def read(self) -> bool:
        """Read the record now; True when ``current`` changed. A role that may not read it: no override."""
        if self._denied:
            return False
        try:
            res = await self.registry.get(self.key)
        except PermissionDenied as e:
            self._refused(e)
            return False
        self._revision = max(self._revision, res.revision)
        return self._set(res.kvs[0].value if res.kvs else None)

    def _refused(self, e: PermissionDenied) -> None:
        self._denied = True
        log.info("cannot read the override record %r, so operator drains do not reach this publisher (grant "
                 "read on %r to follow them): %s", self.key, OVERRIDE_ROOT, e)

    def _set(self, value: bytes | None) -> bool:
        return take_record(self, value)

    async def run(self) -> None:
        """Watch the record until cancelled; after a failure, read it again and watch from there."""
        while not self._denied:
            watch = self.registry.watch(self.key, start_revision=self._revision + 1)
            try:
                async for batch in watch:
                    self._revision = max(self._revision, watch.revision)
                    last = batch[-1] if batch else None
                    if last is not None and self._set(last.kv.value if last.type == "put" else None):
                        log.warning("override %r: %s", self.key,
                                    shown_record(self.current))
                        await self._on_change()
                raise ConnectionError("the watch ended")
            except asyncio.CancelledError:
                raise
            except PermissionDenied as e:
                self._refused(e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.debug("watch of the override record %r failed: %s", self.key, e)
                await asyncio.sleep(cool_down(self._rng, RETRY_INTERVAL))
                try:
                    if await self.read():
                        await self._on_change()
                except asyncio.CancelledError:
                    raise
                except Exception as e2:  # noqa: BLE001
                    log.debug("reading the override record %r failed: %s", self.key, e2)
            finally:
                watch.cancel()
