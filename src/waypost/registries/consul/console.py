"""A Consul registry on the console (``--registry consul://host:8500``): every service of the catalog.

The catalog's service list is followed by one blocking query (``/v1/catalog/services``, answered when it
changes, ``WAIT`` at most) on waypost's control loop; each service is shown through waypost's own Consul resolver
(a ``consul://host:8500/SERVICE`` target: the passing instances, what a client dialing it sees). The override
records live in Consul's KV store under the same path as in etcd (``_waypost/override/<service>/<address>``,
followed by one more blocking query), where a server registered there follows its own: drain and weight work the same.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse

from ...console.board import Board
from ...console.catalog_source import CatalogSource
from ...console.sources import RETRY_INTERVAL, on_control
from ...discovery.override import OVERRIDE_ROOT, parse_override, split_override_key
from .config import ConsulConfig, parse_registry_url
from .overrides import ConsulOverrideStore, kv_read

log = logging.getLogger("waypost.console")

#: the longest a blocking query of the catalog waits for a change
WAIT = 10.0


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


class ConsulSource(CatalogSource):
    kind = "consul"

    def __init__(self, url: str, board: Board, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        #: what the console's writes go through (``actions.apply``): the KV store of this agent, whose client
        #: the source reads with too
        self.writer = ConsulOverrideStore(self.config, timeout)
        super().__init__(self.config.redacted, board, timeout, lambda: self.writer.client)

    def _target(self, service: str) -> str:
        return service_target(self.config, service)

    async def _list(self, index: int, wait: float | None) -> tuple[int, list[str]]:
        """On the control loop: the catalog's service names, and the index to wait from next."""
        params = [("index", str(index)), ("wait", f"{wait:g}s")] if wait else []
        if self.config.datacenter:
            params.append(("dc", self.config.datacenter))
        headers, body = await self.client().request(
            "GET", "/v1/catalog/services", params=params, timeout=(wait or 0) + self.timeout,
            what="the catalog's services")
        names = sorted(n for n in (body or {}) if isinstance(n, str) and n != "consul")
        return int(headers.get("X-Consul-Index", "0") or 0), names

    async def start(self) -> None:
        """One read of the catalog, then the blocking queries. An agent that does not answer is shown as down, not
        raised: ``_follow`` asks again until it answers."""
        index = 0
        try:
            index, names = await on_control(self._list(0, None))
        except Exception as e:  # noqa: BLE001 (shown on the page; asked again)
            self._down(e)
        else:
            await self._apply(names)
        self._spawn(self._follow(index), "consul")
        self._spawn(self._follow_overrides(), "consul-kv")

    async def _follow_overrides(self) -> None:
        """The override records of this agent's KV store on the board (a blocking query of the prefix)."""
        index = 0
        while not self._closed:
            try:
                new_index, items = await on_control(kv_read(self.client(), OVERRIDE_ROOT, recurse=True, index=index,
                                                                   wait=WAIT))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the next query tries again)
                log.debug("console: overrides in %s: %s", self.name, e)
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            index = 0 if new_index < index else new_index
            now = {}
            for key, value in items:
                parts, o = split_override_key(key), parse_override(value)
                if parts is not None and o is not None:
                    now[(self.name, parts[0], parts[1])] = o
            self._show_overrides(now)
            if not index:
                await asyncio.sleep(RETRY_INTERVAL)

    async def _follow(self, index: int) -> None:
        while not self._closed:
            try:
                new_index, names = await on_control(self._list(index, WAIT))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
                self._down(e)
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            index = 0 if new_index < index else new_index  # an index that went back: start over (Consul's rule)
            await self._apply(names)

    async def _apply(self, names: list[str]) -> None:
        self.board.source_up(self.name, "consul")
        await self._follow_names(names)
