"""A ZooKeeper registry on the console (``--registry zk://h1:2181,h2:2181``): the services under its namespace and
the override znodes, listed every ``INTERVAL`` s over the override store's session (shared by every browser); each
service shown through a ``zk://hosts/SERVICE`` target (what a client dialing it sees). Drain and weight write the
override znode, which the registrations in ZooKeeper follow."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

from ...console.board import Board
from ...console.catalog_source import CatalogSource
from ...console.sources import on_control
from ...discovery.override import OVERRIDE_ROOT, parse_override
from .config import DEFAULT_NAMESPACE
from .overrides import ZkOverrides

INTERVAL = 2.0
#: at most this many overrides are read per round
MAX_OVERRIDES = 1000


class ZkSource(CatalogSource):
    kind = "zk"

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.writer = ZkOverrides(url, timeout)  # its session serves the listing too: it is the client
        self.config = self.writer.config
        super().__init__(self.config.url, board, timeout, lambda: self.writer)

    def _target(self, service: str) -> str:
        q = f"?namespace={urllib.parse.quote(self.config.namespace, safe='/')}" \
            if self.config.namespace != DEFAULT_NAMESPACE else ""
        return f"zk://{self.config.connect_string}/{urllib.parse.quote(service, safe='')}{q}"

    async def _read(self) -> tuple[list[str], dict[tuple[str, str, str], dict[str, Any]]]:
        """On the control loop: the services under the namespace, and the override znodes."""
        names = await self.writer.children(self.config.namespace)
        overrides: dict[tuple[str, str, str], dict[str, Any]] = {}
        root = "/" + OVERRIDE_ROOT.rstrip("/")
        for key in (await self.writer.children(root))[:MAX_OVERRIDES]:
            for address in (await self.writer.children(f"{root}/{key}"))[:MAX_OVERRIDES]:
                value = await self.writer.get(f"{root}/{key}/{address}")
                o = parse_override(value) if value is not None else None
                if o is not None:
                    overrides[(self.name, key, address)] = o
        return names, overrides

    async def start(self) -> None:
        """One read, then one every ``INTERVAL`` s. A ZooKeeper that does not answer is shown as down, not raised:
        the next rounds try again until it answers."""
        await self._round()
        self._spawn(self._follow(), "zk")

    async def _follow(self) -> None:
        while not self._closed:
            await asyncio.sleep(INTERVAL)
            await self._round()

    async def _round(self) -> None:
        try:
            names, overrides = await asyncio.wait_for(on_control(self._read()), self.timeout + 5)
        except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
            self._down(e)
            return
        self.board.source_up(self.name, "zk")
        self._show_overrides(overrides)
        await self._follow_names(names)

    async def _release(self) -> None:
        await on_control(self.writer.close())  # it serves the console's writes too: closed whether a read used it or not
