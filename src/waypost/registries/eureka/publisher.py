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

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...discovery.heartbeat_publisher import HeartbeatPublisher
from ...discovery.outage import OnUnregistered
from ...errors import suggests_keywords
from .api import EurekaClient, EurekaNotFound
from .apps import GRPC_PORT_KEY, decode_metadata, encode_metadata
from .config import EurekaConfig, app_name, resolve_config

DATA_CENTER = {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}


class EurekaPublisher(HeartbeatPublisher):
    """Registers ``address`` as an instance of app ``key`` in Eureka (see the module docstring)."""

    registry_name = "Eureka"
    not_found = EurekaNotFound
    update_registers = True  # Eureka replaces the instance
    config: EurekaConfig
    client: EurekaClient

    @suggests_keywords("waypost.EurekaPublisher")
    def __init__(
        self, registry_url_or_config: EurekaConfig | str, key: str, address: str, ttl: int = 10,
        id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = "gozero",
        *, timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        retry_interval: float = 1.0, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app_name(key)
        super().__init__(registry_url_or_config, key, address, ttl, id, metadata, format, timeout=timeout,
                         max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)

    def _check_id(self, id: object) -> None:
        super()._check_id(id)
        if id is not None and any(c in str(id) for c in "/?#%"):
            raise ValueError(f"id {str(id)!r} cannot contain '/', '?', '#' or '%' (a path segment of Eureka's API)")

    def _resolve_config(self, registry_url_or_config: EurekaConfig | str) -> EurekaConfig:
        return resolve_config(registry_url_or_config)

    def _new_client(self) -> EurekaClient:
        return EurekaClient(self.config, timeout=self.timeout)

    def _default_id(self, key: str) -> str:
        return f"{self.host}:{key}:{self.port}"

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

    def __repr__(self) -> str:
        return (f"<EurekaPublisher {self.app}={self.value!r} at {self.config.url} {self._state}"
                f"{' registered as ' + repr(self.instance_id) if self._registered else ''}>")

    # -- the writes, and their words -----------------------------------------------------------------------

    def _where(self) -> str:
        return f"eureka at {', '.join(self.config.base_url(s) for s in self.config.servers)}"

    def _terms(self) -> str:
        return f"lease {self.ttl}s, renewed every {self.renew_interval:g}s"

    async def _write_registration(self) -> None:
        await self.client.register(self.app, self._instance())

    async def _renew(self) -> None:
        """The heartbeat; ``EurekaNotFound`` (the server lost the instance) registers again."""
        await self.client.renew(self.app, self.instance_id)

    async def _remove(self) -> None:
        await self.client.cancel(self.app, self.instance_id)

    def _renewal(self) -> str:
        return "a heartbeat"

    def _lost_text(self, overdue: float, e: Exception) -> str:
        return (f"no heartbeat of {self.instance_id!r} succeeded for {overdue:.1f}s (lease {self.ttl}s), so Eureka "
                f"may have evicted it: {e}")

    def _left_behind(self) -> str:
        return f"could not delete {self.instance_id!r} (Eureka evicts it within {self.ttl}s)"
