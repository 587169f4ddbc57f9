"""A Consul registry on the console (``--registry consul://host:8500``): every service of the catalog.

The catalog's service list is followed by one blocking query (``/v1/catalog/services``, answered when it
changes, ``WAIT`` at most) on waypost's control loop; each service is shown through waypost's own Consul resolver
(a ``consul://host:8500/SERVICE`` target: the passing instances, what a client dialing it sees), read-only:
drain and weight act on etcd and memory registrations.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

from ..consul.api import ConsulClient
from ..consul.config import ConsulConfig, parse_registry_url
from .board import Board
from .sources import RETRY_INTERVAL, TargetSource, on_control

log = logging.getLogger("waypost.console")

#: the longest a blocking query of the catalog waits for a change
WAIT = 10.0
#: at most this many services are followed (each is one resolver)
MAX_SERVICES = 500


def service_target(config: ConsulConfig, service: str) -> str:
    """The dial target of ``service`` through the agent of ``config`` (its token, TLS and datacenter)."""
    opts: list[tuple[str, str]] = []
    if config.token:
        opts.append(("token", config.token))
    if config.tls:
        opts.append(("tls", "1"))
    for name, value in (("cacert", config.ca_file), ("certfile", config.cert_file), ("keyfile", config.key_file),
                        ("dc", config.datacenter)):
        if value:
            opts.append((name, value))
    query = f"?{urllib.parse.urlencode(opts)}" if opts else ""
    return f"consul://{config.address}/{urllib.parse.quote(service, safe='')}{query}"


class ConsulSource:
    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        self.name = self.config.redacted
        self.board = board
        self.timeout = timeout
        self._client: ConsulClient | None = None
        self._services: dict[str, TargetSource] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def _list(self, index: int, wait: float | None) -> tuple[int, list[str]]:
        """On the control loop: the catalog's service names, and the index to wait from next."""
        if self._client is None:
            self._client = ConsulClient(self.config, timeout=self.timeout)
        params = [("index", str(index)), ("wait", f"{wait:g}s")] if wait else []
        if self.config.datacenter:
            params.append(("dc", self.config.datacenter))
        headers, body = await self._client.request(
            "GET", "/v1/catalog/services", params=params, timeout=(wait or 0) + self.timeout,
            what="the catalog's services")
        names = sorted(n for n in (body or {}) if isinstance(n, str) and n != "consul")
        return int(headers.get("X-Consul-Index", "0") or 0), names

    async def start(self) -> None:
        index, names = await on_control(self._list(0, None))
        await self._apply(names)
        self._task = asyncio.create_task(self._follow(index), name="waypost-console-consul")

    async def _follow(self, index: int) -> None:
        while not self._closed:
            try:
                new_index, names = await on_control(self._list(index, WAIT))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
                why = str(e) or type(e).__name__
                if self.board.sources.get(self.name) != why:
                    self.board.sources[self.name] = why
                    self.board.touch()
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            index = 0 if new_index < index else new_index  # an index that went back: start over (Consul's rule)
            if self.board.sources.get(self.name):
                self.board.sources[self.name] = None
                self.board.touch()
            await self._apply(names)

    async def _apply(self, names: list[str]) -> None:
        self.board.sources.setdefault(self.name, None)
        for gone in set(self._services) - set(names):
            await self._services.pop(gone).close()
        for name in names[:MAX_SERVICES]:
            if name in self._services or self._closed:
                continue
            src = TargetSource(service_target(self.config, name), self.board, self.timeout, source=self.name,
                               fmt="consul")
            self._services[name] = src
            try:
                await src.start()
            except Exception as e:  # noqa: BLE001 (shown on the page)
                src.service.error = str(e) or type(e).__name__
                self.board.touch()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        for src in self._services.values():
            await src.close()
        self._services.clear()
        client, self._client = self._client, None
        if client is not None:
            await on_control(client.close())


def is_consul(url: Any) -> bool:
    return isinstance(url, str) and url.strip().lower().startswith("consul://")
