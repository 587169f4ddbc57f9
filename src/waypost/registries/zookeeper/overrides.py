"""Operator overrides in ZooKeeper (``waypost --registry zk://... drain``, the console): the persistent znode
``/_waypost/override/<key>/<address>`` holding the same JSON as in etcd (``waypost.discovery.override``), over a
session of the store's own (on waypost's control loop; ``close()`` after). ``watch`` follows one record, which
is how a registration in ZooKeeper carries an operator's weight (``waypost.kinds.OverrideStore``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ...registry.base import DeleteResult, KeyValue, PutResult
from ...registry.formats import Kratos
from . import client as zk
from .config import parse_registry_url

#: the session asked for these writes (they take a moment)
SESSION_TIMEOUT = 10.0


class ZkOverrides:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.config = parse_registry_url(url)
        self.url = self.config.url
        self.timeout = timeout
        self._client: Any = None

    async def connected(self) -> Any:
        """The store's kazoo client, with a session (``RegistryUnavailable`` naming why not, within ``timeout``)."""
        if self._client is None:
            self._client = zk.new_client(self.config, SESSION_TIMEOUT)
            self._client.start_async()
        await zk.session(self._client, self.config.hosts, self.timeout)
        return self._client

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
            try:
                await zk.result(client.set_async(path, value))
                break
            except NoNodeError:
                try:
                    await zk.result(client.create_async(path, value, makepath=True))
                    break
                except NodeExistsError:
                    continue
        return PutResult(0, KeyValue(path, prev) if prev is not None else None)

    async def delete(self, key: str, *, prev_kv: bool = False) -> DeleteResult:
        from kazoo.exceptions import NoNodeError

        client = await self.connected()
        path = self._path(key)
        prev = await self.get(path) if prev_kv else None
        try:
            await zk.result(client.delete_async(path))
        except NoNodeError:
            pass
        return DeleteResult(0, int(prev is not None), [KeyValue(path, prev)] if prev is not None else [])

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` is an instance of service ``key`` in Kratos' layout now."""
        base = f"{self.config.namespace.rstrip('/')}/{key}"
        codec = Kratos(self.config.namespace)
        for child in await self.children(base):
            entry = codec.decode(f"{base}/{child}", await self.get(f"{base}/{child}") or b"")
            if entry is not None and entry.address == address:
                return True
        return False

    async def watch(self, key: str) -> AsyncIterator[bytes | None]:
        """The record's value now (None: none), then at each change; ends when the connection is lost (kazoo
        forgets its watches then: the caller watches again)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()

        def poke(event: Any) -> None:  # on kazoo's callback thread
            zk.on_loop(loop, events.put_nowait, event)

        last: Any = object()
        while True:
            value = await self.get(self._path(key), watch=poke)
            if value != last:
                last = value
                yield value
            if (await events.get()).type == "NONE":
                return  # kazoo forgot its watches (the session expired)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await zk.close_client(client)
