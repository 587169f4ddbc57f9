"""zk://H1:2181,H2:2181/SERVICE: the instances of a service kept in ZooKeeper in Kratos' layout.

What is read (``waypost.zk.layout``): the children of ``/microservices/SERVICE`` (one ephemeral node per instance,
written by Kratos' ``contrib/registry/zookeeper`` or by ``waypost.discovery.zk_publisher``), each holding Kratos'
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
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _loop, zk
from ..errors import InvalidTarget, RegistryUnavailable
from ..registry.formats import Entry, Kratos
from ..types import Backend
from ..zk.layout import LayoutError
from .base import OnError, OnUpdate, ResolverOptions, notify
from .target import Target

log = logging.getLogger("waypost.resolver.zk")

#: bound on one (re)load of the service's children and their data
LOAD_TIMEOUT = 30.0
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0


class ZkResolver:
    """Follows the instances of ``target`` (scheme zk); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial). ``rng`` and ``clock`` are for tests.
    """

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        zk.require_kazoo()
        options = options if options is not None else ResolverOptions()
        if target.scheme != "zk" or not target.key:
            raise InvalidTarget(f"not a zk target: {target.redacted}")
        self.target = target
        self.config = zk.from_target(target)
        self.service: str = target.key
        try:
            self.path = zk.service_path(self.config.namespace, self.service)
        except LayoutError as e:
            raise InvalidTarget(f"invalid zk target {target.redacted!r}: {e}") from None
        self.session_timeout = self.config.session_timeout_or(zk.DEFAULT_SESSION_TIMEOUT)
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.report_early = options.report_early
        self.timeout = timeout
        self._codec = Kratos(self.config.namespace)
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._future: concurrent.futures.Future[None] | None = None
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._closed = False
        self._events: asyncio.Queue[tuple[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._children: dict[str, Entry | None] = {}  # child name -> its decoded instance (None: unusable)
        self._last: tuple[Backend, ...] | None = None
        self._last_error = ""
        self._error_shown = False  # the channel was told of an error since the last push
        self._stale = False  # disconnected since the last load (kazoo forgot the watches)
        # introspection (and tests): what the loop did so far
        self.loads = 0
        self.events = 0
        self.pushes = 0
        self.connected = False
        #: clock time of the last change pushed to the channel
        self.last_push_at: float | None = None

    # ---- Resolver contract --------------------------------------------------------------------------

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        """Follow the service on the control loop. Blocking (sync dial): return once the first list is known;
        raise RegistryUnavailable when ZooKeeper gives no session (or no list) within ``timeout``."""
        self._future = _loop.submit(self._run(on_update, on_error))
        if not self.blocking:
            return
        try:
            self._first.result(self.timeout + 1.0)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RegistryUnavailable(
                f"zk: no instance list of {self._what()} within {self.timeout:g}s"
                f"{f' ({self._last_error})' if self._last_error else ''}") from None
        except BaseException:
            self.close()
            raise

    def resolve_now(self, reason: str) -> None:
        """Nothing to do: the watches push every change."""

    def close(self) -> None:
        self._closed = True
        if self._future is not None:
            self._future.cancel()

    async def aclose(self) -> None:
        self.close()

    # ---- the loop -----------------------------------------------------------------------------------

    def _what(self) -> str:
        return f"service {self.service!r} ({self.path} at {self.config.connect_string})"

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

    async def _run(self, on_update: OnUpdate, on_error: OnError) -> None:
        loop = self._loop = asyncio.get_running_loop()
        events = self._events = asyncio.Queue()
        client = self.config.new_client(self.session_timeout)
        client.add_listener(self._on_state)
        probing = loop.create_task(zk.probe_hosts(self.config.hosts, min(self.timeout, zk.PROBE_TIMEOUT)))
        probing.add_done_callback(lambda _t: events.put_nowait(("probe", None)))
        first_deadline = loop.time() + self.timeout
        need_load = True
        failures = 0
        try:
            client.start_async()
            while not self._closed:
                if need_load and client.connected:
                    try:
                        await asyncio.wait_for(self._load(client), LOAD_TIMEOUT)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001  # keep the last list, try again
                        failures += 1
                        self._report(on_error, f"zk: reading {self._what()} failed: {_why(e)}")
                    else:
                        need_load, failures, self._stale = False, 0, False
                        if self._last_error:
                            log.info("waypost: zk: reading %s works again", self._what())
                            self._last_error = ""
                        self._push(on_update, force=self._error_shown)
                        if not self._first.done():
                            self._first.set_result(None)
                wait: float | None = None
                if need_load and client.connected:  # a failed load: try again after a pause
                    wait = min(FIRST_BACKOFF * 2 ** max(failures - 1, 0), MAX_BACKOFF) * self._rng.uniform(0.8, 1.2)
                if not self._first.done():
                    left = first_deadline - loop.time()
                    if left <= 0:
                        self._give_up_first(on_error, probing)
                    else:
                        wait = left if wait is None else min(wait, left)
                try:
                    kind, arg = await asyncio.wait_for(events.get(), wait)
                except asyncio.TimeoutError:
                    continue
                if kind == "probe":
                    # report_early (non-blocking start): when no host even takes a TCP connection, say so at
                    # once (calls then fail naming it instead of waiting for the first list)
                    if (self.report_early and not self.blocking and not self._first.done() and not client.connected
                            and not probing.cancelled() and not any(ok for _, _, ok in probing.result())):
                        self._report(on_error, self._no_session(zk.describe_probes(probing.result())))
                    continue
                self.events += 1
                need_load = await self._event(client, kind, arg, on_update, on_error) or need_load
        finally:
            probing.cancel()
            client.remove_listener(self._on_state)
            zk.close_later(client)

    def _no_session(self, probed: str) -> str:
        return f"zk: no ZooKeeper session with {self.config.connect_string} for {self._what()} ({probed})"

    def _give_up_first(self, on_error: OnError, probing: asyncio.Task[list[tuple[str, str, bool]]]) -> None:
        why = self._last_error
        if not why:
            probed = (zk.describe_probes(probing.result()) if probing.done() and not probing.cancelled()
                      else "still connecting")
            why = self._no_session(probed)
        self._report(on_error, why)
        if not self._first.done():
            self._first.set_exception(RegistryUnavailable(f"{why} within {self.timeout:g}s"))

    async def _event(self, client: Any, kind: str, arg: Any, on_update: OnUpdate, on_error: OnError) -> bool:
        """Handle one event; True when everything must be read again once connected."""
        if kind == "state":
            if arg == "CONNECTED":
                self.connected = True
                if self._stale:
                    log.info("waypost: zk: connected to ZooKeeper again for %s; reading it again", self._what())
                return self._stale  # watches forgotten while disconnected: read everything again
            self.connected = False
            self._stale = True
            what = "the ZooKeeper session expired" if arg == "LOST" else "lost the connection to ZooKeeper"
            self._report(on_error, f"zk: {what} ({self.config.connect_string}) for {self._what()}; reconnecting")
            return True
        if arg.type == "NONE":
            return False  # kazoo forgot its watches (connection lost): the state change says what to do
        try:
            if kind == "children":
                await asyncio.wait_for(self._list(client), LOAD_TIMEOUT)
            else:
                await asyncio.wait_for(self._read_child(client, arg.path), LOAD_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  # keep the last list; read everything again
            self._report(on_error, f"zk: reading {self._what()} failed: {_why(e)}")
            return True
        self._push(on_update)
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

    # ---- pushing ------------------------------------------------------------------------------------

    def _backends(self) -> tuple[Backend, ...]:
        seen: set[str] = set()
        out = []
        for _name, entry in sorted(self._children.items()):
            if entry is None or entry.address in seen:
                continue
            seen.add(entry.address)
            out.append(Backend(entry.address, entry.metadata))
        return tuple(out)

    def _push(self, on_update: OnUpdate, force: bool = False) -> None:
        backends = self._backends()
        if backends == self._last and not force:
            return
        out: Sequence[Backend] = list(backends)
        if self.subsetter is not None:
            out = self.subsetter.select(out)
        log.debug("waypost: zk: %s -> %s", self._what(), [b.address for b in backends])
        if self._notify(on_update, out):
            self._last = backends
            self._error_shown = False
            self.pushes += 1
            self.last_push_at = self._clock()

    def _report(self, on_error: OnError, msg: str) -> None:
        (log.warning if msg != self._last_error else log.debug)(
            "waypost: %s; %s", msg, "keeping the last backends" if self._last is not None else "no backends yet")
        self._last_error = msg
        if self._notify(on_error, msg):
            self._error_shown = True

    def _notify(self, fn: Callable[[Any], None], arg: Any) -> bool:
        return notify(fn, arg, self.target)


_GONE: Any = object()


def _why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
