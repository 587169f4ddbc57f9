"""A Consul registry on the console (``--registry consul://host:8500``): the catalog's services (a blocking
query of ``/v1/catalog/services``), each shown through a ``consul://host:8500/SERVICE`` target as a client dialing
it sees it, and the override records of the agent's KV store (another blocking query), written by its buttons.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...console.board import Board
from ...console.catalog_source import CatalogSource
from ...console.sources import RETRY_INTERVAL, on_control
from ...discovery.override import OVERRIDE_ROOT, parse_override, split_override_key
from .api import result_index
from .config import parse_registry_url
from .overrides import ConsulOverrideStore, kv_read

log = logging.getLogger("waypost.console")

#: the longest a blocking query of the catalog waits for a change
WAIT = 10.0


class ConsulSource(CatalogSource):
    kind = "consul"

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        #: what the console's writes go through (``actions.apply``): the KV store of this agent, whose client
        #: the source reads with too
        self.writer = ConsulOverrideStore(self.config, timeout)
        super().__init__(self.config.redacted, board, timeout, lambda: self.writer.client)

    def _target(self, service: str) -> str:
        return self.config.target(service)

    async def _list(self, index: int, wait: float | None) -> tuple[int, list[str]]:
        """On the control loop: the catalog's service names, and the index to wait from next."""
        params, limit = self.client().blocking(index, wait)
        dc = [("dc", self.config.datacenter)] if self.config.datacenter else []
        headers, body = await self.client().request("GET", "/v1/catalog/services", params=params + dc, timeout=limit,
                                                    what="the catalog's services")
        return result_index(headers), sorted(n for n in (body or {}) if isinstance(n, str) and n != "consul")

    async def start(self) -> None:
        """One read of the catalog, then blocking queries of it and of the override records. An agent that does
        not answer is shown as down, not raised: it is asked again until it answers."""
        index = 0
        try:
            index, names = await on_control(self._list(0, None))
        except Exception as e:  # noqa: BLE001 (shown on the page; asked again)
            self._down(e)
        else:
            await self._apply(names)
        self._spawn(self._follow(lambda i: self._list(i, WAIT), self._apply, self._down, index), "consul")
        self._spawn(self._follow(lambda i: kv_read(self.client(), OVERRIDE_ROOT, recurse=True, index=i, wait=WAIT),
                                 self._overrides, lambda e: log.debug("console: overrides in %s: %s", self.name, e)),
                    "consul-kv")

    async def _follow(self, read: Callable[[int], Awaitable[tuple[int, Any]]], take: Callable[[Any], Awaitable[None]],
                      failed: Callable[[Exception], None], index: int = 0) -> None:
        """Blocking reads from the last index until ``close``, each answer given to ``take``; a failure to
        ``failed``, then a pause. An index that went back starts over (Consul's rule); none to block on: a pause."""
        while not self._closed:
            try:
                new_index, got = await on_control(read(index))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (shown or logged; tried again)
                failed(e)
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            index = 0 if new_index < index else new_index
            await take(got)
            if not index:
                await asyncio.sleep(RETRY_INTERVAL)

    async def _overrides(self, items: list[tuple[str, bytes]]) -> None:
        now = {}
        for key, value in items:
            parts, o = split_override_key(key), parse_override(value)
            if parts is not None and o is not None:
                now[(self.name, parts[0], parts[1])] = o
        self._show_overrides(now)

    async def _apply(self, names: list[str]) -> None:
        self.board.source_up(self.name, "consul")
        await self._follow_names(names)
