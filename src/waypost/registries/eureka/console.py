"""An Eureka registry on the console (``--registry eureka://host:8761``): every application it holds.

The application list is read every ``INTERVAL`` s (``GET /eureka/apps``) on waypost's control loop; each
application is shown through waypost's own Eureka discovery (an ``eureka://host:8761/APP`` target: the UP
instances, what a client dialing it sees). Drain and weight write through ``overrides.EurekaOverrideStore`` (Eureka's
status override and metadata). An instance under a status override is shown as an override of weight 0 (it is in
no client's list, so the board lists it among the overrides without a live instance).
"""

from __future__ import annotations

import asyncio

from ...console.board import Board
from ...console.catalog_source import CatalogSource
from ...console.sources import RETRY_INTERVAL, on_control
from .api import EurekaClient
from .apps import RegistryCopy, applications
from .config import parse_registry_url, target_for
from .overrides import EurekaOverrideStore, drained

#: seconds between two reads of the application list
INTERVAL = 3.0


class EurekaSource(CatalogSource):
    kind = "eureka"

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        super().__init__(self.config.url, board, timeout, lambda: EurekaClient(self.config, timeout=timeout))
        #: what the console's writes go through (``actions.apply``): Eureka's status overrides and metadata
        self.writer = EurekaOverrideStore(self.name, timeout, self.client)

    def _target(self, service: str) -> str:
        return target_for(self.config, service)

    async def start(self) -> None:
        """Follow the registry; one that cannot be read yet is shown as down, and read again until it answers."""
        await self._read_once()
        self._spawn(self._follow(), "eureka")

    async def _read_once(self) -> bool:
        copy = RegistryCopy()

        async def read() -> None:  # on the control loop, where the client lives
            client = self.client()
            copy.replace(applications(await client.apps(), client.server), [])

        try:
            await on_control(read())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
            self._down(e)
            return False
        self.board.source_up(self.name, "eureka")
        self._show_overrides({(self.name, inst.app, inst.address): {"weight": 0, "by": "eureka status override"}
                              for app in copy.names() for inst in copy.instances(app)
                              if inst.address and drained(inst)})
        await self._follow_names(copy.names())
        return True

    async def _follow(self) -> None:
        while not self._closed:
            await asyncio.sleep(INTERVAL)
            if not await self._read_once():
                await asyncio.sleep(RETRY_INTERVAL)
