"""EurekaPublisher: keep one address registered as an instance of an application in Eureka, whatever happens to
the server. The same public interface as ``waypost.discovery.Publisher`` (what ``serve()`` drives).

What is registered (``POST /eureka/apps/APP``):

- app ``APP`` = ``key`` upper-cased (Eureka upper-cases application names), ``vipAddress`` = ``key`` as given;
- ``instanceId`` = ``id`` if given, else ``<host>:<key>:<port>`` (Spring Cloud's form, stable across restarts of
  the process, so a restarted server replaces its own stale instance);
- ``ipAddr`` and ``hostName`` = the host of ``address``, ``port`` = its port, ``status`` UP, ``dataCenterInfo``
  MyOwn, ``leaseInfo``: ``durationInSecs`` = ``ttl`` (Eureka evicts an instance not renewed for that long) and
  ``renewalIntervalInSecs`` = ttl/3;
- ``metadata``: strings as they are, other values as JSON text (``waypost.registries.eureka.apps.encode_metadata``; the
  resolver decodes them back), plus ``gRPC_port`` = the port (grpc-spring-boot-starter's convention: Spring's
  gRPC clients dial that port of an instance).

Behaviour:

- ``start()`` registers, retrying while no server can be reached, and raises ``RegistryUnavailable`` naming the
  servers and the last cause if that does not succeed within ``timeout`` s.
- Heartbeat: ``PUT /eureka/apps/APP/ID`` every ttl/3 s. Answered 404 (the server lost the instance: restarted
  empty, evicted it after a long pause, someone deleted it): registered again at once, then retried every ~1 s
  forever, with the outage clock (``outage``) running until it is back. A heartbeat that fails otherwise is
  retried every ~1 s; the registration counts as lost only when none succeeded for ``ttl`` s (when Eureka may
  evict it).
- Several servers in the URL: every request goes to the one that answered last and moves to the next when it
  fails (``EurekaClient``); the peers replicate registrations, and one that has not got ours answers the
  heartbeat 404, which registers again there.
- ``update_metadata(md)``: registers again with the same instance id (Eureka replaces the instance's metadata; a
  status override an operator set stays: Eureka keeps overrides apart from registrations).
- ``pause()`` and ``stop()`` delete the instance (``DELETE``, bounded: if no server answers, Eureka evicts it
  after ``ttl`` s); ``resume()`` registers again. ``stop()`` is idempotent.
- ``format`` is accepted for interface compatibility with ``Publisher`` and ignored; ``lease_id`` is None.

All the work runs on the control loop; the sync methods block the calling thread until it is done and the
``a*`` twins await it from any event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...discovery.group import cool_down
from ...discovery.outage import OnUnregistered, Outage
from ...discovery.publisher_base import REVOKE_TIMEOUT, PublisherBase
from ...errors import RegistryError, RegistryUnavailable, describe_value
from ...netutil import AddressError, check_dialable, parse_host_port
from .api import EurekaClient, EurekaNotFound
from .apps import GRPC_PORT_KEY, decode_metadata, encode_metadata
from .config import EurekaConfig, app_name, resolve_config

log = logging.getLogger("waypost.discovery")

DATA_CENTER = {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}


class EurekaPublisher(PublisherBase):
    """Registers ``address`` as an instance of app ``key`` in Eureka (see the module docstring)."""

    def __init__(
        self, registry_url_or_config: EurekaConfig | str, key: str, address: str, ttl: int = 10,
        id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = "gozero",
        *, timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        retry_interval: float = 1.0, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app_name(key)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl must be a whole number of seconds >= 1, got {describe_value(ttl)}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not isinstance(address, str) or address.startswith(("unix:", "unix-abstract:")):
            raise ValueError(f"Eureka registers host:port addresses, got {describe_value(address)}")
        check_dialable(address, what="publisher address")
        try:
            self.host, self.port = parse_host_port(address, what="publisher address")
        except AddressError as e:
            raise ValueError(str(e)) from None
        if id is not None and (isinstance(id, bool) or not isinstance(id, (int, str)) or str(id) == ""):
            raise ValueError(f"id must be a non-empty string or an int, got {describe_value(id)}")
        if id is not None and any(c in str(id) for c in "/?#%"):
            raise ValueError(f"id {str(id)!r} cannot contain '/', '?', '#' or '%' (a path segment of Eureka's API)")
        self.config = resolve_config(registry_url_or_config)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        self.base_key = key
        self.value = address
        self.instance_id = str(id) if id is not None else f"{self.host}:{key}:{self.port}"
        self.ttl = ttl
        self.timeout = float(timeout)
        self.retry_interval = retry_interval
        #: heartbeats every ttl/3 s (Eureka's own client: 30 s against a 90 s lease)
        self.renew_interval = ttl / 3
        self.format = format  # accepted for Publisher compatibility
        self.metadata = self._checked_metadata(metadata)
        self.client = EurekaClient(self.config, timeout=self.timeout)
        self._rng = rng or random.Random()
        self._clock = clock
        self._last_ok = 0.0  # clock time of the last successful register or renewal
        self._heartbeat_task: asyncio.Task[None] | None = None
        self.registrations = 0  # successful registrations (1 after start, +1 per recovery, resume or update)
        self.renewals = 0

    # -- what is registered --------------------------------------------------------------------------------

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        if metadata:
            encode_metadata(metadata)  # Eureka's key rules, named

    def _instance(self) -> dict[str, Any]:
        meta = {**encode_metadata(self.metadata), GRPC_PORT_KEY: str(self.port)}
        return {
            "instanceId": self.instance_id, "app": self.app, "hostName": self.host, "ipAddr": self.host,
            "vipAddress": self.base_key, "status": "UP",
            "port": {"$": self.port, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
            "dataCenterInfo": DATA_CENTER,
            "leaseInfo": {"renewalIntervalInSecs": max(1, round(self.renew_interval)), "durationInSecs": self.ttl},
            "metadata": meta,
            # Eureka's peers keep the copy with the newest lastDirtyTimestamp
            "lastDirtyTimestamp": str(int(time.time() * 1000)),
        }

    def decoded_metadata(self) -> dict[str, Any]:
        """The metadata as a resolver reads it back (``gRPC_port`` included)."""
        return decode_metadata(self._instance()["metadata"])

    # -- properties ----------------------------------------------------------------------------------------

    @property
    def key(self) -> str | None:
        """The instance id registered now (None while not registered)."""
        return self.instance_id if self._registered else None

    @property
    def lease_id(self) -> None:
        """Eureka's lease is renewed by heartbeats, not named: always None."""
        return None

    @property
    def registry(self) -> EurekaConfig:
        return self.config

    def __repr__(self) -> str:
        return (f"<EurekaPublisher {self.app}={self.value!r} at {self.config.url} {self._state}"
                f"{' registered as ' + repr(self.instance_id) if self._registered else ''}>")

    # -- lifecycle on the control loop ----------------------------------------------------------------------

    def _where(self) -> str:
        return f"eureka at {', '.join(self.config.base_url(s) for s in self.config.servers)}"

    async def _register(self) -> None:
        async with self._write_lock():
            await self.client.register(self.app, self._instance())
        if self._state != "running":  # paused or stopped meanwhile: the caller deletes
            return
        self._registered = True
        self._last_ok = self._clock()
        self.registrations += 1
        self.outage.end()
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat())
        log.debug("%r: registered (lease %ds, renewed every %gs)", self, self.ttl, self.renew_interval)

    async def _withdraw(self) -> None:
        self._cancel_tasks(include_retry=True)
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        try:
            async with self._write_lock():
                await asyncio.wait_for(self.client.cancel(self.app, self.instance_id), REVOKE_TIMEOUT)
        except EurekaNotFound:
            pass  # gone already (evicted, or the server restarted)
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            log.warning("%r: could not delete %r (Eureka evicts it within %ds): %s", self, self.instance_id,
                        self.ttl, str(e) or type(e).__name__)

    async def _close(self) -> None:
        await self.client.close()

    def _cancel_tasks(self, include_retry: bool) -> None:
        current = asyncio.current_task()
        for task in (self._heartbeat_task, self._retry_task if include_retry else None):
            if task is not None and task is not current:
                task.cancel()
        self._heartbeat_task = None
        if include_retry:
            self._retry_task = None

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata
        if self._state != "running" or not self._registered:
            return  # the next registration carries it
        try:
            async with self._write_lock():
                await asyncio.wait_for(self.client.register(self.app, self._instance()), self.timeout)
        except (asyncio.TimeoutError, RegistryError, RegistryUnavailable, OSError) as e:
            why = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
            raise RegistryUnavailable(f"could not update the metadata of {self.instance_id!r} in {self._where()} "
                                      f"within {self.timeout:g}s: {why}") from e
        self.registrations += 1
        self._last_ok = self._clock()

    # -- keeping it alive ----------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew every ttl/3 s; 404: register again now; other failures: retry ~1 s, lost after ttl s."""
        failing = False
        while self._state == "running" and self._registered:
            delay = min(self.retry_interval, self.renew_interval) if failing else self.renew_interval
            await asyncio.sleep(cool_down(self._rng, delay))
            if self._state != "running" or not self._registered:
                return
            try:
                await self.client.renew(self.app, self.instance_id)
            except asyncio.CancelledError:
                raise
            except EurekaNotFound as e:
                self._recover_later(e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                overdue = self._clock() - self._last_ok
                if overdue >= self.ttl:
                    self._recover_later(RegistryUnavailable(
                        f"no heartbeat of {self.instance_id!r} succeeded for {overdue:.1f}s (lease {self.ttl}s), so "
                        f"Eureka may have evicted it: {e}"))
                    return
                (log.warning if not failing else log.debug)(
                    "%r: a heartbeat failed (retrying; lost only after %ds without one): %s", self, self.ttl,
                    str(e) or type(e).__name__)
                failing = True
                continue
            self.renewals += 1
            self._last_ok = self._clock()
            if failing:
                log.info("%r: heartbeats work again", self)
            failing = False

    def _forget(self, reason: BaseException | None) -> None:
        self._cancel_tasks(include_retry=False)
        was_registered, self._registered = self._registered, False
        if was_registered:
            log.warning("%r: registration lost (%s); registering again", self, reason or "unknown reason")
