"""A server's instance in ZooKeeper (docs/zookeeper.md): the EPHEMERAL node ``<namespace>/<service>/<id>`` of
Kratos' layout, living as long as the registrar's session (the timeout the server granted counts: ``SessionLog``).
``register`` makes it exist, belong to this session (a node of an earlier incarnation with this id is taken over,
as Kratos does, unless its session puts it back: a live twin) and hold this data (one ``setData``: clients see a
change of metadata, never a removal and an add). ``guard`` watches it: deleted or another session's, it is
``InstanceGone`` at once; ``renew`` checks it too, and the session (expired: kazoo says so, or no connection for the
whole granted timeout); data rewritten from outside is put back. ``close`` ends the session (what is left goes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ...discovery.formats import Kratos
from ...kinds import Instance, InstanceGone, PermissionDenied, Registrar, RegistryError, RegistryUnavailable
from ...kinds.registration import KindRegistration
from . import client as zk
from .config import ZkConfig, parse_registry_url
from .layout import check_node_name, instance_path

log = logging.getLogger("waypost.discovery")

#: reconcile attempts in a row before giving up for this round (the node changing under us each time)
MAX_ATTEMPTS = 5
#: a node of another session replaced again within this many seconds: refuse (retried every ~1 s), so two live
#: instances sharing one id do not take the node from each other as fast as the network allows
TAKEOVER_PAUSE = 5.0
#: the guard's pause after a failed look at the node (no session yet, closing, ...)
GUARD_RETRY = 0.5


@contextlib.contextmanager
def _kazoo_errors(path: str) -> Iterator[None]:
    """kazoo's failures in waypost's terms: an ACL's refusal, the rest (connection lost, ...: retried)."""
    from kazoo.exceptions import KazooException, NoAuthError

    try:
        yield
    except NoAuthError:
        raise PermissionDenied(f"ZooKeeper refused access to {path} (an ACL)") from None
    except KazooException as e:  # kazoo's exceptions carry no text of their own: their name is the text
        raise RegistryUnavailable(f"ZooKeeper, at {path}: {type(e).__name__}{f': {e}' if str(e) else ''}") from e


class ZkRegistrar(Registrar):
    """One server's ephemeral node (see the module docstring). ``settings``: a ``ZkConfig`` or a registry URL."""

    def __init__(self, settings: ZkConfig | str, timeout: float) -> None:
        self.config = settings if isinstance(settings, ZkConfig) else parse_registry_url(settings)
        self.timeout = timeout
        self._codec = Kratos(self.config.namespace)
        self._zk = zk.Session(self.config, self._on_state)
        self.session_timeout_asked = 0.0  # (set with the session)
        self._down_since: float | None = None  # monotonic time the connection was lost (None: connected)
        self._expired = False  # kazoo reported the session expired, and no node was made since
        self._last_takeover = float("-inf")
        self._told: float | None = None  # the granted session timeout last logged
        self.writes = 0  # setData calls (metadata updates, data put back)

    @property
    def session_timeout(self) -> float:
        """The session timeout the server granted (what decides when the node goes), else the one asked."""
        return self._zk.log.granted or self.session_timeout_asked

    @property
    def session_id(self) -> int | None:
        ids = self._zk.client.client_id if self._zk.client is not None else None
        return ids[0] if ids else None

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        self._codec.encode("check", "127.0.0.1:1", "check", metadata)  # what Kratos' map[string]string refuses

    def _node(self, instance: Instance) -> tuple[str, bytes]:  # (a name ZooKeeper refuses: LayoutError, a ValueError)
        path = instance_path(self.config.namespace, instance.service, instance.id)
        return path, self._codec.encode(instance.service, instance.address, instance.id, instance.metadata)[1]

    def _on_state(self, state: str) -> None:  # on kazoo's connection thread: plain assignments only
        self._down_since = None if state == "CONNECTED" else self._down_since or time.monotonic()
        self._expired = self._expired or state == "LOST"

    async def register(self, instance: Instance) -> None:
        if self._zk.client is None:
            self.session_timeout_asked = self.config.session_timeout_or(instance.ttl)
        await self._zk.ready(self.session_timeout_asked, self.timeout)
        if (granted := self._zk.log.granted) not in (None, self.session_timeout_asked, self._told):
            self._told = granted
            log.info("ZooKeeper granted a session timeout of %gs, not the %gs asked (its min/maxSessionTimeout): the "
                     "node goes %gs after the connection is lost", granted, self.session_timeout_asked, granted)
        await self._reconcile(instance, renewing=False)

    async def renew(self, instance: Instance) -> None:
        down = self._down_since
        if self._zk.client is None or self._expired:
            raise InstanceGone("the ZooKeeper session expired, and the node with it")
        if down is not None:
            if time.monotonic() - down >= self.session_timeout:
                raise InstanceGone(f"no connection for the whole session timeout ({self.session_timeout:g}s): the "
                                   "server has expired the session, and the node with it")
            raise RegistryUnavailable("not connected to ZooKeeper (the node lives as long as the session)")
        await self._reconcile(instance, renewing=True)

    async def _reconcile(self, instance: Instance, renewing: bool) -> None:
        """Make the node exist (renewing: ``InstanceGone`` instead), belong to this session (taken over; renewing:
        ``InstanceGone``) and hold this data (put back)."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        path, data = self._node(instance)
        client = self._zk.client
        with _kazoo_errors(path):
            for _ in range(MAX_ATTEMPTS):
                try:
                    value, stat = await zk.result(client.get_async(path))
                except NoNodeError:
                    if renewing:
                        raise InstanceGone(f"{path} was deleted from outside") from None
                    try:
                        await zk.result(client.create_async(path, data, ephemeral=True, makepath=True))
                    except NodeExistsError:
                        continue
                    self._expired = False
                    return
                if stat.ephemeralOwner != self.session_id:
                    if renewing:
                        raise InstanceGone(f"{path} belongs to another session ({stat.ephemeralOwner:#x})")
                    if time.monotonic() - self._last_takeover < TAKEOVER_PAUSE:
                        raise RegistryError(f"{path} is held by another live session ({stat.ephemeralOwner:#x}) "
                                            "that puts it back: do two running instances share this id?")
                    self._last_takeover = time.monotonic()
                    log.info("%s belongs to another session (%#x; an earlier incarnation with this id?): replacing "
                             "it, as Kratos does", path, stat.ephemeralOwner)
                    with contextlib.suppress(NoNodeError, BadVersionError):
                        await zk.result(client.delete_async(path, version=stat.version))
                    continue
                if value != data:
                    if renewing:
                        log.info("%s was rewritten from outside: putting our data back", path)
                    try:
                        await zk.result(client.set_async(path, data, version=stat.version))
                    except (NoNodeError, BadVersionError):
                        continue
                    self.writes += 1
                self._expired = False
                return
        raise RegistryError(f"{path} changed under us {MAX_ATTEMPTS} times in a row")

    async def guard(self, instance: Instance) -> None:
        """``InstanceGone`` as soon as the node is deleted or another session's: an ``exists`` watch, set again
        after each event. A failed look is retried (no connection: kazoo fires the watch, and holds the next look
        until it is back); the session is ``renew``'s to judge."""
        path, _ = self._node(instance)
        loop, changed = asyncio.get_running_loop(), asyncio.Event()

        def on_event(_event: Any) -> None:  # on kazoo's thread; one function, so kazoo's set holds one watch
            zk.on_loop(loop, changed.set)

        while True:
            changed.clear()
            try:
                stat = await zk.result(self._zk.client.exists_async(path, watch=on_event))
            except Exception as e:  # noqa: BLE001 (session expired, closing, ...: looked at again soon)
                log.debug("watching %s failed (retrying): %s", path, str(e) or type(e).__name__)
                await asyncio.sleep(GUARD_RETRY)
                continue
            if stat is None:
                raise InstanceGone(f"{path} was deleted from outside")
            if stat.ephemeralOwner != self.session_id:
                raise InstanceGone(f"{path} belongs to another session ({stat.ephemeralOwner:#x})")
            await changed.wait()

    async def deregister(self, instance: Instance) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        client = self._zk.client
        path, _ = self._node(instance)
        if client is None or not client.connected:
            log.warning("not connected to ZooKeeper, so %s stays until its session expires (<= %gs)", path,
                        self.session_timeout)
            return
        with _kazoo_errors(path):
            stat = await zk.result(client.exists_async(path))
            if stat is None or stat.ephemeralOwner != self.session_id:
                return  # gone already, or someone else's
            with contextlib.suppress(NoNodeError, BadVersionError):
                await zk.result(client.delete_async(path, version=stat.version))

    async def close(self) -> None:
        await self._zk.close()


class ZkPublisher(KindRegistration):
    """What ``serve(registry="zk://...")`` registers with, made by hand: ``waypost.Publisher``'s arguments
    (``registry`` a ``zk://`` URL or a ``ZkConfig``; ``format`` ignored: the layout is Kratos'). Its registrar is
    ``client``."""

    client: ZkRegistrar

    def __init__(self, registry: ZkConfig | str, key: str, address: str, ttl: int = 10, id: int | str | None = None,
                 metadata: Mapping[str, Any] | None = None, format: object = None, **kw: Any) -> None:
        from .kind import KIND

        check_node_name(key, "publisher key (the service name)")  # LayoutError, a ValueError, naming the problem
        super().__init__(KIND, registry, key, address, ttl, id, metadata, format, **kw)
