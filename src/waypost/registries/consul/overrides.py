"""An operator's override of a Consul registration (``waypost drain`` / the console): the KV key
``_waypost/override/<key>/<address>``, followed by a blocking query, the same record as in etcd
(``discovery/override.py``)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ...discovery.override import OVERRIDE_ROOT, RETRY_INTERVAL, override_key, shown_record, take_record
from ...discovery.subscriber import cool_down
from ...errors import PermissionDenied
from .kv import kv_get

log = logging.getLogger("waypost.discovery")


class ConsulOverrideFollower:
    """The same for a ``ConsulPublisher``: the record is a key of Consul's KV store (same path and JSON),
    followed by a blocking query of at most ``CONSUL_WAIT`` seconds at a time."""

    CONSUL_WAIT = 60.0

    def __init__(self, client: Any, key: str, address: str, on_change: Callable[[], Awaitable[None]],
                 rng: random.Random) -> None:
        self.client = client
        self.key = override_key(key, address)
        self.current: dict[str, Any] | None = None
        self._on_change = on_change
        self._rng = rng
        self._index = 0
        self._denied = False
        self._bad_logged = False

    async def read(self, wait: float | None = None) -> bool:
        """Read the key now (``wait``: block until it changes after the last read); True when ``current``
        changed. An ACL token that may not read it: no override (said once)."""
        if self._denied:
            return False
        try:
            index, value = await kv_get(self.client, self.key, index=self._index, wait=wait)
        except PermissionDenied as e:
            self._denied = True
            log.info("cannot read the override key %r in consul, so operator drains do not reach this publisher "
                     "(give its token key_prefix \"%s\" read): %s", self.key, OVERRIDE_ROOT, e)
            return False
        self._index = 0 if index < self._index else index  # an index that went back: start over
        return take_record(self, value)

    async def run(self) -> None:
        while not self._denied:
            try:
                if await self.read(self.CONSUL_WAIT if self._index else None):
                    log.warning("override %r: %s", self.key,
                                shown_record(self.current))
                    await self._on_change()
                if not self._index:  # no index to block on: do not spin
                    await asyncio.sleep(cool_down(self._rng, RETRY_INTERVAL))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.debug("reading the override key %r in consul failed: %s", self.key, e)
                await asyncio.sleep(cool_down(self._rng, RETRY_INTERVAL))
