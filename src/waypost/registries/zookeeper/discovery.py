"""zk://H1:2181,H2:2181/SERVICE: a backend per usable child of ``<namespace>/SERVICE`` (Kratos' layout: the first
``grpc://`` endpoint and the metadata; the rest skipped, logged once per node). One session for the discovery's
life; each ``watch`` waits for it (no host taking a TCP connection: ``RegistryUnavailable`` at once, naming each
host's answer), loads the children and their data with watches (a data watch too: metadata changes are seen at
once, where Kratos waits for the next children change), yields the list, then one per change. A lost connection
ends it (kazoo forgets its watches): the next ``watch`` reads everything again, the new list replacing the old."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator
from typing import Any

from ...discovery.formats import Entry, Kratos
from ...kinds import Backend, Backoff, Discovery, InvalidTarget, RegistryUnavailable, Target
from . import client as zk
from .config import DEFAULT_SESSION_TIMEOUT, from_target
from .layout import LayoutError, service_path

LOAD_TIMEOUT = 30.0  # bound on one (re)load of the service's children and their data
SESSION_WAIT = 10.0  # how long a ``watch`` waits for a session while a host takes TCP connections (then fails)
_GONE: Any = object()


class ZkDiscovery(Discovery):
    """The instances of ``target``'s service (scheme zk), loaded and watched; see the module docstring."""

    backoff = Backoff(first=0.5, cap=1.0, jitter=0.2)  # as kazoo reconnects: read again within ~1 s of it

    def __init__(self, target: Target) -> None:
        self.config = from_target(target)
        try:
            self.path = service_path(self.config.namespace, target.key or "")
        except LayoutError as e:
            raise InvalidTarget(f"invalid zk target {target.redacted!r}: {e}") from None
        self._codec = Kratos(self.config.namespace)
        self._zk = zk.Session(self.config, lambda state: self._post("state", state))
        self._on_watch = functools.partial(self._post, "watch")  # one object: kazoo keeps one watch of it a path
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._children: dict[str, Entry | None] = {}  # child name -> its decoded instance (None: unusable)
        # introspection (and tests): what was read so far, and whether the session is up
        self.loads = 0
        self.connected = False

    def describe(self, service: str) -> str:
        return f"service {service!r} ({self.path} at {self.config.connect_string})"

    def _post(self, kind: str, arg: Any) -> None:  # from kazoo's threads: queue an event for the loop
        if self._loop is not None:
            zk.on_loop(self._loop, self._events.put_nowait, (kind, arg))

    async def instances(self, service: str) -> list[Backend]:
        async with contextlib.aclosing(self.watch(service)) as lists:
            return await anext(lists)

    async def watch(self, service: str) -> AsyncGenerator[list[Backend], None]:
        self._loop = asyncio.get_running_loop()
        client = await self._zk.ready(self.config.session_timeout_or(DEFAULT_SESSION_TIMEOUT), SESSION_WAIT)
        while not self._events.empty():  # what happened before is read again below
            self._events.get_nowait()
        self.connected = True
        await asyncio.wait_for(self._load(client), LOAD_TIMEOUT)
        last = self._backends()
        yield last
        while True:
            kind, arg = await self._events.get()
            if kind == "state":
                if arg == "CONNECTED":
                    continue
                self.connected = False
                what = "the ZooKeeper session expired" if arg == "LOST" else "lost the connection to ZooKeeper"
                raise RegistryUnavailable(f"{what} ({self.config.connect_string}); reconnecting")
            if arg.type == "NONE":
                continue  # kazoo forgot its watches (connection lost): the state change says what to do
            self._children.pop((arg.path or "").removeprefix(self.path + "/"), None)  # a child's data changed
            await asyncio.wait_for(self._load(client, everything=False), LOAD_TIMEOUT)
            if (now := self._backends()) != last:
                last = now
                yield now

    async def close(self) -> None:
        await self._zk.close()

    # ---- reading ------------------------------------------------------------------------------------

    async def _load(self, client: Any, everything: bool = True) -> None:
        """The children (watched) and the data (watched) of each one, or, after an event, of those not known (the
        gone ones dropped)."""
        names = await self._names(client)
        children = {} if everything else {n: self._children[n] for n in names if n in self._children}
        new = [n for n in names if n not in children]
        entries = await asyncio.gather(*(self._get(client, n) for n in new))
        children.update((n, e) for n, e in zip(new, entries) if e is not _GONE)
        self._children = children
        self.loads += everything

    async def _names(self, client: Any) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            names = await zk.result(client.get_children_async(self.path, watch=self._on_watch))
        except NoNodeError:
            # no instance ever registered here: wait for the service node to appear
            if await zk.result(client.exists_async(self.path, watch=self._on_watch)) is None:
                return []
            names = await zk.result(client.get_children_async(self.path, watch=self._on_watch))
        return sorted(names)

    async def _get(self, client: Any, name: str) -> Any:
        """The child's decoded instance (None when unusable, logged once), or _GONE when it no longer exists."""
        from kazoo.exceptions import NoNodeError

        path = f"{self.path}/{name}"
        try:
            data, _stat = await zk.result(client.get_async(path, watch=self._on_watch))
        except NoNodeError:
            return _GONE
        return self._codec.decode(path, data or b"")

    def _backends(self) -> list[Backend]:
        first: dict[str, Entry] = {}  # address -> the entry of the first node (by name) with it
        for _name, entry in sorted(self._children.items()):
            if entry is not None:
                first.setdefault(entry.address, entry)
        return [Backend(entry.address, entry.metadata) for entry in first.values()]
