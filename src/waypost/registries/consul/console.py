"""A Consul registry on the console (``--registry consul://host:8500``): the catalog's services (a blocking
query of ``/v1/catalog/services``), each shown through a ``consul://host:8500/SERVICE`` target as a client dialing
it sees it, and the override records of the agent's KV store (another blocking query), written by its buttons.
"""

from __future__ import annotations

import asyncio
import logging

from ...console.board import Board
from ...console.sources import RETRY_INTERVAL, on_control
from ...discovery.override import OVERRIDE_ROOT, parse_override, split_override_key
from ..http_kind import RereadCatalog
from .api import result_index
from .config import parse_registry_url
from .overrides import ConsulOverrideStore, kv_read

log = logging.getLogger("waypost.console")

#: the longest a blocking query of the catalog waits for a change
WAIT = 10.0


class ConsulSource(RereadCatalog):
    kind = "consul"

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        #: what the console's writes go through (``actions.apply``): the KV store of this agent, whose client
        #: the source reads with too
        self.writer = ConsulOverrideStore(self.config, timeout)
        super().__init__(self.config.redacted, board, timeout, lambda: self.writer.client)
        self._index: int | None = None  # the catalog's index to block from (None: not read yet)

    def _target(self, service: str) -> str:
        return self.config.target(service)

    async def _read(self) -> tuple[list[str], None]:
        """The catalog's service names: a blocking query from the last answer's index (the first read, and one
        from an index that went back, a plain one)."""
        if self._index == 0:  # no index to block on: no spinning
            await asyncio.sleep(RETRY_INTERVAL)
        params, limit = self.client().blocking(self._index or 0, WAIT)
        dc = [("dc", self.config.datacenter)] if self.config.datacenter else []
        headers, body = await self.client().request("GET", "/v1/catalog/services", params=params + dc, timeout=limit,
                                                    what="the catalog's services")
        index = result_index(headers)
        self._index = 0 if index < (self._index or 0) else index
        return sorted(n for n in (body or {}) if isinstance(n, str) and n != "consul"), None

    async def start(self) -> None:
        """The catalog followed (``RereadCatalog``), and the override records of the KV store."""
        await super().start()
        self._spawn(self._follow_overrides(), "consul-kv")

    async def _follow_overrides(self) -> None:
        """Blocking queries of the records until ``close``, each answer shown; a failure logged, then a pause."""
        index = 0
        while not self._closed:
            try:
                new_index, items = await on_control(kv_read(self.client(), OVERRIDE_ROOT, recurse=True, index=index,
                                                            wait=WAIT))
            except Exception as e:  # noqa: BLE001 (logged; read again)
                log.debug("console: overrides in %s: %s", self.name, e)
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            index = 0 if new_index < index else new_index  # an index that went back: start over
            self._show_overrides({(self.name, *parts): o for key, value in items
                                  if (parts := split_override_key(key)) and (o := parse_override(value))})
            if not index:  # no index to block on: no spinning
                await asyncio.sleep(RETRY_INTERVAL)
