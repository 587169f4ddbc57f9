"""zk://H1:2181,H2:2181/SERVICE: the instances of a service kept in ZooKeeper in Kratos' layout.

What is read (``layout``): the children of ``/microservices/SERVICE`` (one ephemeral node per instance, written by
Kratos' ``contrib/registry/zookeeper`` or by waypost's registrar), each holding Kratos' ``ServiceInstance`` JSON; a
backend is the instance's first ``grpc://`` endpoint with its metadata (strings, plus ``version`` when set).
Instances without a ``grpc://`` endpoint (HTTP-only), with another ``name`` or with data that is not such JSON are
skipped (logged once per node), as are duplicates of an address; the rest stay.

A ``waypost.kinds.Discovery`` (waypost's generic resolver follows it), on the control loop with kazoo's
asynchronous operations. One session for the discovery's life; each ``watch``:

1. waits for the session (no host taking a TCP connection: ``RegistryUnavailable`` at once, naming each host's
   answer; kazoo goes on reconnecting, every <= 1 s, and the resolver calls ``watch`` again after its backoff);
2. **loads**: the service node's children with a children watch (an exists watch while the node does not exist:
   no instance yet), then every child's data with a data watch, and yields the list;
3. **follows**: a children event lists the children again (new ones read, gone ones dropped), a data event reads
   that child again (its metadata changed); each change of the list is yielded;
4. ends with ``RegistryUnavailable`` when the connection is lost (kazoo forgets its watches then): the channel
   keeps the last list, and the next ``watch`` reads everything again once connected, the new list replacing the
   old in one push (an instance that stayed is never removed and added back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ...kinds import Backend, Discovery, InvalidTarget, RegistryUnavailable, Target
from ...registry.formats import Entry, Kratos
from . import client as zk
from .config import DEFAULT_SESSION_TIMEOUT, from_target
from .layout import LayoutError, service_path

#: bound on one (re)load of the service's children and their data
LOAD_TIMEOUT = 30.0
#: how long one ``watch`` waits for a session while a host takes TCP connections (then it fails, naming why)
SESSION_WAIT = 10.0
_GONE: Any = object()


class ZkDiscovery(Discovery):
    """The instances of ``target``'s service (scheme zk), loaded and watched; see the module docstring."""

    def __init__(self, target: Target) -> None:
        zk.require_kazoo()
        self.config = from_target(target)
        try:
            self.path = service_path(self.config.namespace, target.key or "")
        except LayoutError as e:
            raise InvalidTarget(f"invalid zk target {target.redacted!r}: {e}") from None
        self._codec = Kratos(self.config.namespace)
        self._client: Any = None
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

    def _on_children(self, event: Any) -> None:
        self._post("children", event)

    def _on_data(self, event: Any) -> None:
        self._post("data", event)

    def _started(self) -> Any:
        if self._client is None:
            self._loop = asyncio.get_running_loop()
            self._client = zk.new_client(self.config, self.config.session_timeout_or(DEFAULT_SESSION_TIMEOUT))
            self._client.add_listener(lambda state: self._post("state", state))
            self._client.start_async()
        return self._client

    async def instances(self, service: str) -> list[Backend]:
        client = self._started()
        await zk.session(client, self.config.hosts, SESSION_WAIT)
        await asyncio.wait_for(self._load(client), LOAD_TIMEOUT)
        return self._backends()

    async def watch(self, service: str) -> AsyncIterator[list[Backend]]:
        client = self._started()
        await zk.session(client, self.config.hosts, SESSION_WAIT)
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
            if kind == "children":
                await asyncio.wait_for(self._list(client), LOAD_TIMEOUT)
            else:
                await asyncio.wait_for(self._read_child(client, arg.path), LOAD_TIMEOUT)
            if (now := self._backends()) != last:
                last = now
                yield now

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await zk.close_client(client)

    # ---- reading ------------------------------------------------------------------------------------

    async def _load(self, client: Any) -> None:
        """Everything again: the children (watched) and each child's data (watched)."""
        names = await self._names(client)
        entries = await asyncio.gather(*(self._get(client, name) for name in names))
        self._children = {name: entry for name, entry in zip(names, entries) if entry is not _GONE}
        self.loads += 1

    async def _list(self, client: Any) -> None:
        """The children changed: read the new ones, drop the gone ones."""
        names = await self._names(client)
        new = [n for n in names if n not in self._children]
        entries = await asyncio.gather(*(self._get(client, n) for n in new))
        children = {n: self._children[n] for n in names if n in self._children}
        children.update((n, e) for n, e in zip(new, entries) if e is not _GONE)
        self._children = children

    async def _read_child(self, client: Any, path: str | None) -> None:
        name = (path or "").removeprefix(self.path + "/")
        if not path or name == path:
            return
        entry = await self._get(client, name)
        if entry is _GONE:
            self._children.pop(name, None)  # (the children watch says so too)
        else:
            self._children[name] = entry

    async def _names(self, client: Any) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            names = await zk.result(client.get_children_async(self.path, watch=self._on_children))
        except NoNodeError:
            # no instance ever registered here: wait for the service node to appear
            if await zk.result(client.exists_async(self.path, watch=self._on_children)) is None:
                return []
            names = await zk.result(client.get_children_async(self.path, watch=self._on_children))
        return sorted(names)

    async def _get(self, client: Any, name: str) -> Any:
        """The child's decoded instance (None when unusable, logged once), or _GONE when it no longer exists."""
        from kazoo.exceptions import NoNodeError

        path = f"{self.path}/{name}"
        try:
            data, _stat = await zk.result(client.get_async(path, watch=self._on_data))
        except NoNodeError:
            return _GONE
        return self._codec.decode(path, data or b"")

    def _backends(self) -> list[Backend]:
        seen: set[str] = set()
        out = []
        for _name, entry in sorted(self._children.items()):
            if entry is not None and entry.address not in seen:
                seen.add(entry.address)
                out.append(Backend(entry.address, entry.metadata))
        return out
