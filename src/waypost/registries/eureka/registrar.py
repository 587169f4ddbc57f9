"""One server's instance in Eureka: the ``Registrar`` of ``serve(registry="eureka://...")``, and
``waypost.EurekaPublisher``.

It registers (``POST /eureka/apps/APP``) app ``APP`` = the service upper-cased (``vipAddress``: as given),
``instanceId`` = ``serve(id=...)`` else ``<host>:<service>:<port>`` (Spring Cloud's form: a restarted server
replaces its own stale instance), ``ipAddr``/``hostName``/``port`` from the address, status UP, ``leaseInfo``
(``durationInSecs`` = ttl, Eureka's eviction; renewals every ttl/3), metadata as strings (``apps.encode_metadata``)
plus ``gRPC_port`` = the port (grpc-spring-boot-starter's convention: Spring's gRPC clients dial it). The renewal
is the heartbeat ``PUT /eureka/apps/APP/ID``: its 404 (the server lost the instance, or a peer has not got it yet)
registers again at once. New metadata registers again with the same id (an operator's status override stays).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import suggests_keywords
from ...kinds import Instance, Registrar
from ...kinds.registration import KindRegistration
from .api import EurekaClient
from .apps import GRPC_PORT_KEY, encode_metadata
from .config import URL_FORM, EurekaConfig, app_name, parse_registry_url
from .kind import KIND

DATA_CENTER = {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}


class EurekaRegistrar(Registrar):
    """Registers instances in the Eureka cluster of ``config``; ``timeout`` bounds each server's try."""

    def __init__(self, config: EurekaConfig | str, timeout: float) -> None:
        self.client = EurekaClient(URL_FORM.settings(config, EurekaConfig, parse_registry_url), timeout=timeout)

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        encode_metadata(metadata)  # Eureka's key rules, named

    @staticmethod
    def _names(instance: Instance) -> tuple[str, str]:
        """The app and the instance id, both path segments of Eureka's API (ValueError naming a bad one)."""
        if any(c in instance.id for c in "/?#%"):
            raise ValueError(f"id {instance.id!r} cannot contain '/', '?', '#' or '%' (a path segment of Eureka's "
                             "API)")
        return app_name(instance.service), instance.id

    async def register(self, instance: Instance) -> None:
        app, iid = self._names(instance)
        ttl = instance.ttl
        await self.client.register(app, {
            "instanceId": iid, "app": app, "hostName": instance.host, "ipAddr": instance.host,
            "vipAddress": instance.service, "status": "UP",
            "port": {"$": instance.port, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
            "dataCenterInfo": DATA_CENTER,
            "leaseInfo": {"renewalIntervalInSecs": max(1, round(ttl / 3)), "durationInSecs": ttl},
            "metadata": {**encode_metadata(instance.metadata), GRPC_PORT_KEY: str(instance.port)},
            # Eureka's peers keep the copy with the newest lastDirtyTimestamp
            "lastDirtyTimestamp": str(int(time.time() * 1000)),
        })

    async def renew(self, instance: Instance) -> None:
        await self.client.renew(*self._names(instance))  # 404: EurekaNotFound, an InstanceGone

    async def deregister(self, instance: Instance) -> None:
        await self.client.cancel(*self._names(instance))

    async def close(self) -> None:
        await self.client.close()


class EurekaPublisher(KindRegistration):
    """``waypost.EurekaPublisher``: the registration ``serve(registry="eureka://...")`` makes, by name: ``address``
    kept registered as an instance of app ``key`` (the arguments are ``waypost.Publisher``'s; ``format`` is
    ignored)."""

    @suggests_keywords("waypost.EurekaPublisher")
    def __init__(self, registry_url_or_config: EurekaConfig | str, key: str, address: str, ttl: int = 10,
                 id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = None, *,
                 timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: Any = None,
                 retry_interval: float = 1.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(KIND, registry_url_or_config, key, address, ttl, id, metadata, format, timeout=timeout,
                         max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)
