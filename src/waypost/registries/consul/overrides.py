"""An operator's override of a Consul instance (``waypost drain``, the console): the KV key
``_waypost/override/<service>/<address>`` holding the same JSON record as in etcd (``waypost.discovery.override``).
``ConsulOverrideStore`` writes and reads them; its ``watch`` (a blocking query of the key) is how a server
registered in Consul follows its own record: while one is there its registration carries the record's weight.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from ...discovery.override import OVERRIDE_ROOT
from ...discovery.store import DeleteResult, KeyValue, PutResult
from ...kinds import PermissionDenied, RegistryError
from ...netutil import parse_host_port
from .api import INSIDE, ConsulClient, result_index
from .config import ConsulConfig, parse_registry_url

log = logging.getLogger("waypost.discovery")

#: the longest one blocking query of a key waits for a change
WAIT = 60.0
#: the keys a token was refused (said once per process)
_DENIED: set[str] = set()


def _path(key: str) -> str:
    return "/v1/kv/" + urllib.parse.quote(key, safe="/")


def _value(item: Any) -> bytes:
    raw = item.get("Value") if isinstance(item, dict) else None
    return base64.b64decode(raw) if isinstance(raw, str) else b""


async def kv_read(client: ConsulClient, key: str, *, recurse: bool = False, index: int = 0,
                  wait: float | None = None, within: float | None = None) -> tuple[int, list[tuple[str, bytes]]]:
    """The key (``recurse``: every key under the prefix) with its value, and the index to block on next; with
    ``index`` > 0 and ``wait``, a blocking query that answers when it changes (or after ``wait`` s)."""
    params, limit = client.blocking(index, wait)
    headers, body = await client.request("GET", _path(key), params=[("recurse", "1")] * recurse + params,
                                         timeout=limit, missing_ok=True,
                                         within=None if limit else within,
                                         what=f"reading the key{'s under' if recurse else ''} {key!r}")
    if body is not None and not isinstance(body, list):
        raise RegistryError(f"consul at {client.config.base_url}: the key {key!r} answered {str(body)[:120]!r}")
    return result_index(headers), [(i["Key"], _value(i)) for i in body or ()
                                   if isinstance(i, dict) and isinstance(i.get("Key"), str)]


class ConsulOverrideStore:
    """The override records of one agent's KV store: ``url`` a registry URL (or its ``ConsulConfig``)."""

    def __init__(self, url: str | ConsulConfig, timeout: float = 5.0) -> None:
        self.config = url if isinstance(url, ConsulConfig) else parse_registry_url(url)
        self.url = self.config.redacted
        self.timeout = timeout
        self.client = ConsulClient(self.config, timeout=timeout * INSIDE)

    async def _previous(self, key: str) -> KeyValue | None:
        _, items = await kv_read(self.client, key)
        return KeyValue(key, items[0][1]) if items else None

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> PutResult:
        prev = await self._previous(key) if prev_kv else None
        await self.client.request("PUT", _path(key), body=json.loads(value), what=f"writing the key {key!r}")
        return PutResult(0, prev)

    async def delete(self, key: str, *, prev_kv: bool = False) -> DeleteResult:
        prev = await self._previous(key) if prev_kv else None
        await self.client.request("DELETE", _path(key), what=f"deleting the key {key!r}")
        return DeleteResult(0, int(prev is not None), [prev] if prev is not None else [])

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` is an instance of service ``key`` in the catalog now (passing or not)."""
        _, entries = await self.client.health_service(key, passing=False)
        host, port = parse_host_port(address)
        return any((e.get("Service") or {}).get("Port") == port and
                   (e.get("Service") or {}).get("Address") in (host, address.rpartition(":")[0])
                   for e in entries if isinstance(e, dict))

    async def watch(self, key: str) -> AsyncIterator[bytes | None]:
        """The record's value now (None: none), then at each change. A token that may not read it: no override
        (said once), and nothing more is asked."""
        index, last, first = 0, None, True
        while True:
            try:
                new_index, items = await kv_read(self.client, key, index=index, wait=WAIT, within=self.timeout)
            except PermissionDenied as e:
                (log.debug if key in _DENIED else log.info)(
                    "cannot read the override key %r in consul, so operator drains do not reach this server (give its "
                    "token key_prefix \"%s\" read): %s", key, OVERRIDE_ROOT, e)
                _DENIED.add(key)
                if first:
                    yield None  # no override it may read
                await asyncio.Event().wait()  # until the registration goes (cancelled)
                return
            index = 0 if new_index < index else new_index  # an index that went back: start over
            value = items[0][1] if items else None
            if first or value != last:
                first, last = False, value
                yield value
            if not index:  # no index to block on: do not spin
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        await self.client.close()
