"""An Eureka registry on the console (``--registry eureka://host:8761``): every application it holds.

The application list is read every ``interval`` s (``GET /eureka/apps``) on waypost's control loop; each
application is shown through waypost's own Eureka discovery (an ``eureka://host:8761/APP`` target: the UP
instances, what a client dialing it sees). Drain and weight write through ``overrides.EurekaOverrideStore`` (Eureka's
status override and metadata). An instance under a status override is shown as an override of weight 0 (it is in
no client's list, so the board lists it among the overrides without a live instance).
"""

from __future__ import annotations

from typing import Any

from ...console.board import Board
from ..http_kind import RereadCatalog
from .apps import RegistryCopy, applications
from .config import parse_registry_url, target_for
from .overrides import EurekaOverrideStore, drained


class EurekaSource(RereadCatalog):
    kind = "eureka"
    #: seconds between two reads of the application list
    interval = 3.0

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        #: what the console's writes go through (``actions.apply``): Eureka's status overrides and metadata, with
        #: the client the source reads with too
        self.writer = EurekaOverrideStore(self.config.url, timeout)
        super().__init__(self.config.url, board, timeout, lambda: self.writer.client)

    def _target(self, service: str) -> str:
        return target_for(self.config, service)

    async def _read(self) -> tuple[list[str], dict[tuple[str, str, str], dict[str, Any]]]:
        """The applications, and the instances under a status override (drained)."""
        client, copy = self.client(), RegistryCopy()
        copy.replace(applications(await client.apps(), client.server), [])
        return copy.names(), {(self.name, inst.app, inst.address): {"weight": 0, "by": "eureka status override"}
                              for app in copy.names() for inst in copy.instances(app)
                              if inst.address and drained(inst)}
