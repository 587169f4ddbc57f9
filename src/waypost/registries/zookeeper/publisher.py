"""ZkPublisher: keep one address registered in ZooKeeper as an ephemeral node in Kratos' layout, whatever
happens to the session. The same public interface as ``waypost.discovery.Publisher`` (what ``serve()`` drives).

What is registered (``waypost.registries.zookeeper.layout``): the EPHEMERAL node ``<namespace>/<key>/<id>`` (namespace
``/microservices`` unless the registry URL says ``?namespace=``; the persistent parents are created when missing,
with empty data, as Kratos does), holding Go's JSON of Kratos' ``ServiceInstance``:
``{"id":"<id>","name":"<key>","version":"","metadata":null,"endpoints":["grpc://<address>"]}``. ``id`` is the
given one, else a UUID made once per publisher (Kratos' default ID is a UUID too), so the path stays the same
across re-registrations. Metadata values are written as strings (Kratos' ``map[string]string``) and
``metadata["version"]`` becomes the ``version`` field, as in Kratos' etcd records
(``waypost.registry.formats.Kratos``, whose encoder this uses).

Behaviour:

- ``start()`` opens a session (``ttl`` s asked of the server unless the URL says ``session_timeout``; the server
  grants a value between its min and max session timeout, by default 2 and 20 ticks, and that granted value is
  ``session_timeout`` from then on: what every count below uses) and creates the node, retrying (a ZooKeeper
  that starts a little after this server is waited for); ``RegistryUnavailable`` if that is not done within
  ``timeout`` s, naming why (each host refused, did not answer, ...). ``PermissionDenied`` as it is when an ACL
  refuses the write.
- The node is watched: deleted by someone else, it is created again at once (counted in ``restorations``);
  rewritten by someone else, our data is put back. A node of another session found at our path (a previous
  incarnation with the same ``id`` whose session has not expired yet) is deleted and ours created, as Kratos does.
- Connection lost (``SUSPENDED``): the node lives as long as the session, so nothing changes while kazoo reconnects
  (within ``session_timeout`` the session resumes, with the node). No connection for the whole session timeout,
  or the session reported expired (``LOST``): the node is gone; the outage clock runs (``outage``: ``begin`` then)
  and, as soon as a new session is established, the node is created again (``registrations`` +1, ``outage.end``).
  Reconnection attempts never stop (every <= 1 s, jittered); a failing re-creation is retried every ~1 s (+-5%)
  forever and logged once per state change.
- ``update_metadata(md)`` rewrites the node's data in place (one ``setData``): waypost resolvers see one change
  of that backend's metadata, never a removal and an add. (Kratos' own watcher sets no data watch: it notices the
  new data at its next children change.)
- ``pause()`` deletes the node (the session stays), ``resume()`` creates it again; ``stop()`` deletes it, closes the
  session and is idempotent; bounded: if ZooKeeper is unreachable then, the node goes when the server expires the
  session (``session_timeout`` s).
- An operator's override (``waypost drain``): the znode ``/_waypost/override/<key>/<address>``, read with a watch
  before each write of the node; its ``weight`` replaces the metadata's in the node's data (``override.py``).
- ``format`` is accepted for interface compatibility with ``Publisher`` and ignored (ZooKeeper registrations have
  one layout: Kratos'); ``lease_id`` is always None (the session plays the lease's role; ``session_id`` says
  which).

All the work runs on the control loop with kazoo's asynchronous operations (kazoo's own threads hand results and
events over; the loop never blocks); the sync methods block the calling thread until it is done, and the ``a*``
twins await it from any event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ... import _loop, metrics
from ...backoff import cool_down
from ...discovery.heartbeat_publisher import check_ttl
from ...discovery.outage import OnUnregistered, Outage
from ...discovery.override import OverrideState, apply_override
from ...discovery.publisher_base import REVOKE_TIMEOUT, PublisherBase
from ...errors import PermissionDenied, RegistryError, RegistryUnavailable, describe_value, suggests_keywords
from ...netutil import check_dialable
from ...registry.formats import Kratos
from . import client as zk
from .config import ZkConfig
from .layout import LayoutError
from .session import granted as granted_session_timeout

log = logging.getLogger("waypost.discovery")


#: reconcile attempts in a row before giving up for this round (the node changing under us each time)
MAX_ATTEMPTS = 5
#: a node of another session replaced again within this many seconds: refuse (retried every ~1 s), so two live
#: instances sharing one id do not take the node from each other as fast as the network allows
TAKEOVER_PAUSE = 5.0


class ZkPublisher(PublisherBase):
    """Registers ``address`` as an instance of service ``key`` in ZooKeeper (see the module docstring)."""

    _extra_wait = REVOKE_TIMEOUT + zk.CLOSE_TIMEOUT + 10  # closing the session joins kazoo threads

    @suggests_keywords("waypost.ZkPublisher")
    def __init__(
        self, registry_url_or_config: ZkConfig | str, key: str, address: str, ttl: int = 10,
        id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: Any = "gozero",
        *, timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        retry_interval: float = 1.0, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            zk.check_node_name(key, "publisher key (the service name)")
        except LayoutError as e:
            raise ValueError(str(e)) from None
        check_ttl(ttl)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {describe_value(timeout)}")
        if isinstance(id, bool) or not (id is None or isinstance(id, (int, str))):
            raise TypeError(f"id must be an int, a str or None, got {describe_value(id)}")
        check_dialable(address, what="publisher address")
        self.config = zk.resolve_config(registry_url_or_config)
        self.registry_url = self.config.url
        self.base_key = key
        self.value = address
        self.id = str(id) if id is not None else str(uuid.uuid4())
        try:
            self.path = zk.instance_path(self.config.namespace, key, self.id)
        except LayoutError as e:
            raise ValueError(str(e)) from None
        self.ttl = ttl
        #: the session timeout asked of ZooKeeper; ``session_timeout`` is the one the server granted once connected
        #: (it bounds what is asked to its min/maxSessionTimeout, and the granted value decides when the node goes)
        self.session_timeout_asked = self.config.session_timeout_or(ttl)
        self.session_timeout = self.session_timeout_asked
        self.timeout = float(timeout)
        self.retry_interval = retry_interval
        self.format = format  # accepted for Publisher compatibility; ZooKeeper has one layout (Kratos')
        self._codec = Kratos(self.config.namespace)
        #: the outage clock and the alert after ``max_unregistered`` (see ``waypost.discovery.outage``)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        #: an operator's weight override: the znode ``/_waypost/override/<key>/<address>`` (``override.py``)
        self.override = OverrideState(key, address)
        self.metadata = self._checked_metadata(metadata)
        self._rng = rng or random.Random()
        self._client: Any = None
        self._session: int | None = None  # the session our node belongs to (while registered)
        self._lost: str | None = None  # why the node went: "deleted" (from outside) or "session"
        self._wake: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._suspended = False  # the connection was lost (since the last CONNECTED)
        self._last_takeover = float("-inf")
        self.registrations = 0  # nodes created in a new session: 1 after start, +1 per recovery or resume
        self.restorations = 0  # nodes created again after someone deleted them (same session)
        self.writes = 0  # setData calls (metadata updates, data put back)

    def _encode(self, metadata: Mapping[str, Any] | None) -> bytes:
        path, value = self._codec.encode(self.base_key, self.value, self.id, metadata)
        if path != self.path:  # the encoder's key is the layout's path (same join); never differs
            raise AssertionError(f"Kratos encoder path {path!r} != layout path {self.path!r}")
        return value

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        self._encode(metadata)  # raises on an address the Kratos encoder refuses

    # -- properties ------------------------------------------------------------------------------

    @property
    def key(self) -> str | None:
        """The node path while registered (None otherwise)."""
        return self.path if self._registered else None

    @property
    def lease_id(self) -> None:
        return None

    @property
    def session_id(self) -> int | None:
        """The ZooKeeper session the node belongs to (None while not registered)."""
        return self._session if self._registered else None

    @property
    def data(self) -> bytes:
        """The node's data as this publisher writes it now (an operator's override applied)."""
        return self._encode(apply_override(self.metadata, self.override.current))

    def __repr__(self) -> str:
        return (f"<ZkPublisher {self.base_key!r}={self.value!r} {self._state}"
                f"{' registered as ' + repr(self.path) if self._registered else ''} in {self.registry_url}>")

    # -- lifecycle on the control loop -------------------------------------------------------------

    def _where(self) -> str:
        return self.registry_url

    def _why(self, e: BaseException) -> str:
        return _why(e)

    def _retryable(self, e: Exception) -> bool:
        return True  # kazoo's errors say the connection or the session failed: worth another attempt

    async def _attempt(self, left: float) -> None:
        """Open a session unless one is open (``zk.connect`` names why not, within ``left`` s), then make the
        node; keep it from then on (the keeper)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + left
        client = self._client
        if client is None:
            client = self._client = self.config.new_client(self.session_timeout_asked)
            client.add_listener(self._listener(client))
            try:
                await zk.connect(client, self.config.hosts, left)
            except BaseException:
                self._client = None
                zk.close_later(client)
                raise
            self._note_granted(client)
        elif not client.connected:
            raise RegistryUnavailable("not connected to ZooKeeper")
        await asyncio.wait_for(self._ensure(), max(0.1, deadline - loop.time()))
        self._start_keeper()

    async def _abandon(self) -> None:
        self._stop_keeper()
        self._registered = False
        client, self._client = self._client, None
        if client is not None:
            zk.close_later(client)

    def _resuming(self) -> None:
        self._lost = None
        self._start_keeper()

    def _recover_later(self, reason: BaseException | None) -> None:
        """The keeper registers again (it retries until it works); the outage clock runs meanwhile."""
        if self._state != "running":
            return
        self.outage.begin()
        self._start_keeper()
        self._poke()

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._wake = asyncio.Event()
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name=f"waypost-zk-pub {self.path}")

    def _stop_keeper(self) -> None:
        if self._keeper is not None and self._keeper is not asyncio.current_task():
            self._keeper.cancel()
        self._keeper = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    async def _withdraw(self) -> None:
        self._stop_keeper()
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        await self._delete_own(REVOKE_TIMEOUT)

    async def _close(self) -> None:
        """Close the session: ZooKeeper then deletes the node too, should the delete have failed."""
        self._stop_keeper()
        self._registered = False
        self.outage.end()  # stopped on purpose: not an outage
        client, self._client = self._client, None
        if client is not None:
            await zk.close_client(client)
            log.info("%r: stopped", self)

    async def _delete_own(self, timeout: float, client: Any = None) -> None:
        """Delete our node if it is there and ours (bounded; else it goes with the session)."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        client = client if client is not None else self._client
        if client is None or not client.connected:
            log.warning("%r: not connected to ZooKeeper, so %s stays until its session expires (<= %gs)",
                        self, self.path, self.session_timeout)
            return

        async def delete() -> None:
            async with self._write_lock():
                stat = await zk.result(client.exists_async(self.path))
                ids = client.client_id
                if stat is None or ids is None or stat.ephemeralOwner != ids[0]:
                    return  # gone already, or someone else's
                try:
                    await zk.result(client.delete_async(self.path, version=stat.version))
                except (NoNodeError, BadVersionError):
                    pass

        try:
            await asyncio.wait_for(delete(), timeout)
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            log.warning("%r: could not delete %s (it goes when its session ends, <= %gs): %s", self, self.path,
                        self.session_timeout, _why(e))

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata  # what every later registration and put-back writes
        if not self._registered or self._client is None:
            return
        try:
            await asyncio.wait_for(self._ensure(), self.timeout)
        except PermissionDenied:
            raise
        except Exception as e:
            self._poke()  # the keeper writes it once ZooKeeper answers
            raise RegistryUnavailable(
                f"could not update the metadata of {self.base_key!r}={self.value!r} in {self.registry_url} "
                f"within {self.timeout:g}s: {_why(e)}; it is written once ZooKeeper answers") from e
        log.info("%r: metadata updated to %r", self, metadata)

    # -- keeping the node ------------------------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _ensure(self) -> None:
        """One reconciliation: make our node exist, belong to our session and hold our data; arm its watch."""
        from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError

        client = self._client
        async with self._write_lock():
            for _ in range(MAX_ATTEMPTS):
                if self._state != "running" or client is not self._client:
                    return
                ids = client.client_id
                if ids is None:
                    raise RegistryUnavailable("not connected to ZooKeeper")
                session = ids[0]
                await self._read_override(client)
                data = self._encode(apply_override(self.metadata, self.override.current))
                try:
                    value, stat = await zk.result(client.get_async(self.path, watch=self._on_watch))
                except NoNodeError:
                    try:
                        await zk.result(client.create_async(self.path, data, ephemeral=True, makepath=True))
                    except NodeExistsError:
                        continue
                    except NoAuthError as e:
                        raise PermissionDenied(f"ZooKeeper refused to create {self.path} (ACL of a parent "
                                               f"node): {_why(e)}") from None
                    self._created(session)
                    self._registered_in(session)
                    continue  # read it back, with the watch armed
                except NoAuthError as e:
                    raise PermissionDenied(f"ZooKeeper refused to read {self.path}: {_why(e)}") from None
                if stat.ephemeralOwner != session:
                    now = time.monotonic()
                    if now - self._last_takeover < TAKEOVER_PAUSE:
                        # replaced one already a moment ago and it is back: a live session keeps putting it there
                        raise RegistryError(
                            f"{self.path} is held by another live session ({stat.ephemeralOwner:#x}) that puts it "
                            "back: do two running instances share this id?")
                    self._last_takeover = now
                    log.info("%r: %s belongs to another session (%#x; an earlier incarnation with this id?): "
                             "replacing it, as Kratos does", self, self.path, stat.ephemeralOwner)
                    try:
                        await zk.result(client.delete_async(self.path, version=stat.version))
                    except (NoNodeError, BadVersionError):
                        pass
                    except NoAuthError as e:
                        raise PermissionDenied(f"ZooKeeper refused to delete {self.path}: {_why(e)}") from None
                    continue
                if value != data:
                    try:
                        await zk.result(client.set_async(self.path, data, version=stat.version))
                    except (NoNodeError, BadVersionError):
                        continue
                    except NoAuthError as e:
                        raise PermissionDenied(f"ZooKeeper refused to write {self.path}: {_why(e)}") from None
                    self.writes += 1
                self._registered_in(session)
                return
            raise RegistryError(f"{self.path} changed under us {MAX_ATTEMPTS} times in a row")

    async def _read_override(self, client: Any) -> None:
        """Read the override znode, with a watch that pokes the keeper when it comes, changes or goes."""
        from kazoo.exceptions import NoAuthError, NoNodeError

        if self.override.denied:
            return
        path = self.override.key
        try:
            stat = await zk.result(client.exists_async(path, watch=self._on_override_watch))
            value = None
            if stat is not None:
                try:
                    value, _ = await zk.result(client.get_async(path))
                except NoNodeError:
                    value = None
        except NoAuthError as e:
            self.override.denied = True
            log.info("%r: cannot read the override node %s, so operator drains do not reach this publisher: %s",
                     self, path, _why(e))
            return
        self.override.take(value)

    def _on_override_watch(self, event: Any) -> None:  # on kazoo's callback thread
        zk.on_loop(_loop.get_loop(), self._on_override_event, event)

    def _on_override_event(self, event: Any) -> None:
        if self._state == "running" and event.type != "NONE":
            self._poke()  # the keeper reads it again and rewrites the node's data if the weight changed

    def _created(self, session: int) -> None:
        lost, self._lost = self._lost, None
        obs = metrics.current
        if lost == "deleted" and session == self._session:
            self.restorations += 1
            if obs is not None:
                obs.registration_restored(self.base_key)
            log.info("%r: %s created again", self, self.path)
            return
        self.registrations += 1
        if lost == "session" and obs is not None:
            obs.lease_reregistered(self.base_key)

    def _registered_in(self, session: int) -> None:
        first = not self._registered
        self._registered, self._session = True, session
        lasted = self.outage.end()
        if first:
            log.info("%r: registered in session %#x%s", self, session,
                     f" after {lasted:.1f}s unregistered" if lasted else "")

    async def _keep(self) -> None:
        """Reconcile whenever something happened (a state change, a watch event, a failure to retry)."""
        failing = False
        wake = self._wake
        assert wake is not None
        while self._state == "running":
            await wake.wait()
            wake.clear()
            client = self._client
            if client is None or not client.connected:
                continue  # the CONNECTED state change pokes again
            try:
                await asyncio.wait_for(self._ensure(), self.timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if not failing:
                    failing = True
                    log.warning("%r: registering failed, retrying every ~%gs until it works: %s", self,
                                self.retry_interval, _why(e))
                else:
                    log.debug("%r: registering failed again: %s", self, _why(e))
                await asyncio.sleep(cool_down(self._rng, self.retry_interval))
                wake.set()
                continue
            if failing:
                failing = False
                log.warning("%r: registered again after failures", self)

    # -- kazoo's threads hand over here ------------------------------------------------------------

    def _listener(self, client: Any) -> Callable[[str], None]:
        loop = asyncio.get_running_loop()

        def on_state(state: str) -> None:  # on kazoo's connection thread: hand over, never block
            zk.on_loop(loop, self._on_session_state, client, state)

        return on_state

    def _on_watch(self, event: Any) -> None:  # on kazoo's callback thread
        zk.on_loop(_loop.get_loop(), self._on_node_event, event)

    def _on_node_event(self, event: Any) -> None:
        if self._state != "running":
            return
        if event.type == "DELETED" and self._registered:
            log.warning("%r: %s was deleted from outside; creating it again", self, self.path)
            self._registered = False
            self._lost = "deleted"
        elif event.type == "NONE":
            return  # kazoo forgot its watches (connection lost): the state change says what to do
        self._poke()

    def _on_session_state(self, client: Any, state: str) -> None:
        if client is not self._client or self._state == "stopped":
            return
        if state == "SUSPENDED":
            self._suspended = True
            log.info("%r: connection to ZooKeeper lost; the node lives as long as the session (%gs) while "
                     "reconnecting", self, self.session_timeout)
            if self._expiry is None:
                self._expiry = asyncio.get_running_loop().call_later(self.session_timeout, self._presume_expired)
            return
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if state == "LOST":
            self._session_lost("the session expired")
        elif state == "CONNECTED":
            self._note_granted(client)
            if self._suspended:
                log.info("%r: connected to ZooKeeper again", self)
            self._suspended = False
            self._poke()

    def _note_granted(self, client: Any) -> None:
        granted = granted_session_timeout(client)
        if granted is None or granted == self.session_timeout:
            return
        self.session_timeout = granted
        if granted != self.session_timeout_asked:
            log.info("%r: ZooKeeper granted a session timeout of %gs (%gs asked; the server's min/maxSessionTimeout "
                     "bound it): the node goes %gs after the connection is lost", self, granted,
                     self.session_timeout_asked, granted)

    def _presume_expired(self) -> None:
        self._expiry = None
        client = self._client
        if client is not None and not client.connected:
            self._session_lost(f"no connection for the whole session timeout ({self.session_timeout:g}s): the "
                               "server has expired the session")

    def _session_lost(self, why: str) -> None:
        if self._state != "running":
            return
        if self._registered or self._lost != "session":
            log.warning("%r: %s, so %s is gone; creating it again once connected", self, why, self.path)
        self._registered = False
        self._lost = "session"
        self.outage.begin()


def _why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text and type(e).__module__.startswith("kazoo") else (
        text or type(e).__name__)
