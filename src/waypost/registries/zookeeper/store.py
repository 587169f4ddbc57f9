"""Operator overrides in ZooKeeper (``waypost --registry zk://... drain``): the persistent znode
``/_waypost/override/<key>/<address>`` holding the same JSON as in etcd, which ``ZkPublisher`` watches. The two
writes ``actions.apply`` makes, over a session of its own (run on waypost's control loop; ``close()`` after)."""

from __future__ import annotations

from typing import Any

from ...registry.base import DeleteResult, KeyValue, PutResult
from ...registry.formats import Kratos
from . import client as zk

#: the session asked for these writes (they take a moment)
SESSION_TIMEOUT = 10.0


class ZkOverrides:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.config = zk.resolve_config(url)
        self.url = self.config.url
        self.timeout = timeout
        self._client: Any = None

    async def _session(self) -> Any:
        if self._client is None:
            client = self.config.new_client(SESSION_TIMEOUT)
            try:
                await zk.connect(client, self.config.hosts, self.timeout)
            except BaseException:
                zk.close_later(client)
                raise
            self._client = client
        return self._client

    @staticmethod
    def _path(key: str) -> str:
        return key if key.startswith("/") else "/" + key

    async def _previous(self, client: Any, path: str) -> KeyValue | None:
        from kazoo.exceptions import NoNodeError

        try:
            value, _ = await zk.result(client.get_async(path))
        except NoNodeError:
            return None
        return KeyValue(path, value)

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> PutResult:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        client = await self._session()
        path = self._path(key)
        prev = await self._previous(client, path) if prev_kv else None
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
        return PutResult(0, prev)

    async def delete(self, key: str, *, prev_kv: bool = False) -> DeleteResult:
        from kazoo.exceptions import NoNodeError

        client = await self._session()
        path = self._path(key)
        prev = await self._previous(client, path) if prev_kv else None
        try:
            await zk.result(client.delete_async(path))
        except NoNodeError:
            pass
        return DeleteResult(0, int(prev is not None), [prev] if prev is not None else [])

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` is an instance of service ``key`` in Kratos' layout now."""
        client = await self._session()
        base = f"{self.config.namespace.rstrip('/')}/{key}"
        codec = Kratos(self.config.namespace)
        from kazoo.exceptions import NoNodeError

        try:
            children = await zk.result(client.get_children_async(base))
        except NoNodeError:
            return False  # no instance of the service at all
        for child in children:
            value, _ = await zk.result(client.get_async(f"{base}/{child}"))
            entry = codec.decode(f"{base}/{child}", value)
            if entry is not None and entry.address == address:
                return True
        return False

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await zk.close_client(client)


