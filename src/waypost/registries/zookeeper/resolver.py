"""zk://H1:2181,H2:2181/SERVICE: the instances of a service kept in ZooKeeper in Kratos' layout.

What is read (``waypost.registries.zookeeper.layout``): the children of ``/microservices/SERVICE`` (one ephemeral node per instance,
written by Kratos' ``contrib/registry/zookeeper`` or by ``waypost.registries.zookeeper.publisher``), each holding Kratos'
``ServiceInstance`` JSON; a backend is the instance's first ``grpc://`` endpoint with its metadata (strings, plus
``version`` when set). Instances without a ``grpc://`` endpoint (HTTP-only), with another ``name`` or with data that
is not such JSON are skipped (logged once per node), as are duplicates of an address; the rest stay.

How, on the control loop with kazoo's asynchronous operations (kazoo's threads hand results and events over):

1. **load**: the service node's children with a children watch (an exists watch while the node does not exist:
   no instance yet), then every child's data with a data watch, all requests pipelined;
2. **follow**: a children event lists the children again (new ones read, gone ones dropped); a data event reads
   that child again (its metadata changed); each change that alters the backend list is pushed once;
3. **connection lost** (kazoo's SUSPENDED, or LOST when the session expired): the channel keeps the last list
   (``on_error`` says why), kazoo reconnects (every <= 1 s, forever), and once connected everything is read again
   (kazoo forgets its watches on a disconnection); the new list replaces the old one in one push, so an instance
   that stayed is never removed and added back.

A blocking start (sync dial) returns once the first list is known, or raises RegistryUnavailable after
``timeout`` s naming why (each host refused, did not answer, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidTarget
from ...registry.formats import Entry, Kratos
from ...resolver.base import ResolverOptions
from ...resolver.loop_resolver import LoopResolver
from ...resolver.target import Target
from ...types import Backend
from . import client as zk
from .layout import LayoutError

log = logging.getLogger("waypost.resolver.zk")

#: bound on one (re)load of the service's children and their data
LOAD_TIMEOUT = 30.0


@dataclass
class _Session:
    """What the loop keeps while it runs: kazoo's client, the queue its threads hand events to, and the TCP probe
    of the hosts (what a start's error says when no session comes)."""

    client: Any
    events: asyncio.Queue[tuple[str, Any]]
    probing: asyncio.Task[list[tuple[str, str, bool]]]


class ZkResolver(LoopResolver[_Session]):
    """Follows the instances of ``target`` (scheme zk); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial). ``rng`` and ``clock`` are for tests.
    """

    kind = "zk"
    noun = "backends"
    list_name = "instance list"
    log = log

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        zk.require_kazoo()
        if target.scheme != "zk" or not target.key:
            raise InvalidTarget(f"not a zk target: {target.redacted}")
        super().__init__(target, options, rng=rng, clock=clock)
        self.config = zk.from_target(target)
        self.service: str = target.key
        try:
            self.path = zk.service_path(self.config.namespace, self.service)
        except LayoutError as e:
            raise InvalidTarget(f"invalid zk target {target.redacted!r}: {e}") from None
        self.session_timeout = self.config.session_timeout_or(zk.DEFAULT_SESSION_TIMEOUT)
        self.timeout = timeout
        self._codec = Kratos(self.config.namespace)
        self._events: asyncio.Queue[tuple[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probing: asyncio.Task[list[tuple[str, str, bool]]] | None = None
        self._children: dict[str, Entry | None] = {}  # child name -> its decoded instance (None: unusable)
        self._stale = False  # disconnected since the last load (kazoo forgot the watches)
        # introspection (and tests): what the loop did so far
        self.loads = 0
        self.events = 0
        self.connected = False

    # ---- the loop -----------------------------------------------------------------------------------

    def _what(self) -> str:
        return f"service {self.service!r} ({self.path} at {self.config.connect_string})"

    def _first_list_within(self) -> float:
        return self.timeout

    def _post(self, kind: str, arg: Any) -> None:
        """From kazoo's threads: queue an event for the loop."""
        loop, events = self._loop, self._events
        if loop is not None and events is not None:
            zk.on_loop(loop, events.put_nowait, (kind, arg))

    def _on_state(self, state: str) -> None:  # kazoo's connection thread
        self._post("state", state)

    def _on_children(self, event: Any) -> None:  # kazoo's callback thread
        self._post("children", event)

    def _on_data(self, event: Any) -> None:  # kazoo's callback thread
        self._post("data", event)

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[_Session]:
        loop = self._loop = asyncio.get_running_loop()
        events = self._events = asyncio.Queue()
        client = self.config.new_client(self.session_timeout)
        client.add_listener(self._on_state)
        probing = self._probing = loop.create_task(
            zk.probe_hosts(self.config.hosts, min(self.timeout, zk.PROBE_TIMEOUT)))
        probing.add_done_callback(lambda _t: events.put_nowait(("probe", None)))
        try:
            client.start_async()
            yield _Session(client, events, probing)
        finally:
            probing.cancel()
            client.remove_listener(self._on_state)
            zk.close_later(client)

    async def _follow(self, session: _Session) -> None:
        """Once connected: everything read (watched) and pushed in one replacement, then the watches followed
        until everything must be read again (a reconnection, a failed read)."""
        while not session.client.connected:
            await self._event(session, *await session.events.get())
        await asyncio.wait_for(self._load(session.client), LOAD_TIMEOUT)
        self._stale = False
        if self._read_worked():
            log.info("waypost: zk: reading %s works again", self._what())
        self._push(self._backends())
        while not await self._event(session, *await session.events.get()):
            pass

    def _describe(self, e: Exception) -> str:
        return f"zk: reading {self._what()} failed: {_why(e)}"

    def _no_session(self, probed: str) -> str:
        return f"zk: no ZooKeeper session with {self.config.connect_string} for {self._what()} ({probed})"

    def _why_no_list(self) -> str:
        """The last failure, else why there is no session: what the probe of each host found."""
        if self._last_error:
            return self._last_error
        probing = self._probing
        probed = (zk.describe_probes(probing.result()) if probing is not None and probing.done()
                  and not probing.cancelled() else "still connecting")
        return self._no_session(probed)

    def _no_list_error(self) -> str:
        return f"{self._why_no_list()} within {self.timeout:g}s"

    async def _event(self, session: _Session, kind: str, arg: Any) -> bool:
        """Handle one event; True when everything must be read again once connected."""
        if kind == "probe":
            # report_early (non-blocking start): when no host even takes a TCP connection, say so at once (calls
            # then fail naming it instead of waiting for the first list)
            probing = session.probing
            if (self.report_early and not self.blocking and not self._first.done()
                    and not session.client.connected and not probing.cancelled()
                    and not any(ok for _, _, ok in probing.result())):
                self._report(self._no_session(zk.describe_probes(probing.result())))
            return False
        self.events += 1
        if kind == "state":
            if arg == "CONNECTED":
                self.connected = True
                if self._stale:
                    log.info("waypost: zk: connected to ZooKeeper again for %s; reading it again", self._what())
                return self._stale  # watches forgotten while disconnected: read everything again
            self.connected = False
            self._stale = True
            what = "the ZooKeeper session expired" if arg == "LOST" else "lost the connection to ZooKeeper"
            self._report(f"zk: {what} ({self.config.connect_string}) for {self._what()}; reconnecting")
            return True
        if arg.type == "NONE":
            return False  # kazoo forgot its watches (connection lost): the state change says what to do
        try:
            if kind == "children":
                await asyncio.wait_for(self._list(session.client), LOAD_TIMEOUT)
            else:
                await asyncio.wait_for(self._read_child(session.client, arg.path), LOAD_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  # keep the last list; read everything again
            self._report(self._describe(e))
            return True
        self._push(self._backends())
        return False

    # ---- reading ------------------------------------------------------------------------------------

    async def _load(self, client: Any) -> None:
        """Everything again: the children (watched) and each child's data (watched), then one replacement."""
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
        prefix = self.path + "/"
        if not path or not path.startswith(prefix):
            return
        name = path[len(prefix):]
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
            stat = await zk.result(client.exists_async(self.path, watch=self._on_children))
            if stat is None:
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

    # ---- the list -----------------------------------------------------------------------------------

    def _backends(self) -> tuple[Backend, ...]:
        seen: set[str] = set()
        out = []
        for _name, entry in sorted(self._children.items()):
            if entry is None or entry.address in seen:
                continue
            seen.add(entry.address)
            out.append(Backend(entry.address, entry.metadata))
        return tuple(out)


_GONE: Any = object()


def _why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
