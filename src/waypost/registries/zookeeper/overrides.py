"""Operator overrides in ZooKeeper (``waypost drain``, the console): the persistent znode
``/_waypost/override/<key>/<address>`` holding the JSON etcd holds (``waypost.discovery.override``), over a session
of the store's own. ``watch`` follows one record: how a registration in ZooKeeper carries an operator's weight."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from ...discovery.formats import Kratos
from ...discovery.store import DeleteResult, KeyValue, PutResult
from . import client as zk
from .config import parse_registry_url

SESSION_TIMEOUT = 10.0  # the session asked for these reads and writes (they take a moment)


class ZkOverrides:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        self.url = self.config.url
        self.timeout = timeout
        self._zk = zk.Session(self.config)

    async def connected(self) -> Any:
        """The store's kazoo client, with a session (``RegistryUnavailable`` naming why not, within ``timeout``)."""
        return await self._zk.ready(SESSION_TIMEOUT, self.timeout)

    async def get(self, path: str, watch: Any = None) -> bytes | None:
        """The node's data (None: no node); ``watch`` is called once when it comes, changes or goes."""
        from kazoo.exceptions import NoNodeError

        client = await self.connected()
        if watch is not None and await zk.result(client.exists_async(path, watch=watch)) is None:
            return None
        try:
            value, _ = await zk.result(client.get_async(path))
        except NoNodeError:
            return None
        return bytes(value)

    async def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(await zk.result((await self.connected()).get_children_async(path)))
        except NoNodeError:
            return []

    @staticmethod
    def _path(key: str) -> str:
        return key if key.startswith("/") else "/" + key

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> PutResult:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        client = await self.connected()
        path = self._path(key)
        prev = await self.get(path) if prev_kv else None
        for _ in range(3):  # created or deleted by someone else meanwhile: once more
            with contextlib.suppress(NoNodeError):
                await zk.result(client.set_async(path, value))
                break
            with contextlib.suppress(NodeExistsError):
                await zk.result(client.create_async(path, value, makepath=True))
                break
        return PutResult(0, KeyValue(path, prev) if prev is not None else None)

    async def delete(self, key: str, *, prev_kv: bool = False) -> DeleteResult:
        from kazoo.exceptions import NoNodeError

        client = await self.connected()
        path = self._path(key)
        prev = await self.get(path) if prev_kv else None
        with contextlib.suppress(NoNodeError):
            await zk.result(client.delete_async(path))
        return DeleteResult(0, int(prev is not None), [KeyValue(path, prev)] if prev is not None else [])

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` is an instance of service ``key`` in Kratos' layout now."""
        base = f"{self.config.namespace.rstrip('/')}/{key}"
        codec = Kratos(self.config.namespace)
        found = [codec.decode(f"{base}/{c}", await self.get(f"{base}/{c}") or b"") for c in await self.children(base)]
        return any(entry is not None and entry.address == address for entry in found)

    async def watch(self, key: str) -> AsyncIterator[bytes | None]:
        """The record's value now (None: none), then at each change; ends when the connection is lost (kazoo
        forgets its watches then: the caller watches again)."""
        events: asyncio.Queue[Any] = asyncio.Queue()
        poke = functools.partial(zk.on_loop, asyncio.get_running_loop(), events.put_nowait)  # from kazoo's threads
        last: Any = object()
        while True:
            value = await self.get(self._path(key), watch=poke)
            if value != last:
                last = value
                yield value
            if (await events.get()).type == "NONE":
                return  # kazoo forgot its watches (the session expired)

    async def close(self) -> None:
        await self._zk.close()
