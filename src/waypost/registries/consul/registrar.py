"""Registering a server in Consul (``serve(registry="consul://HOST:8500")``): the instance as a service of the
agent of the URL (``PUT /v1/agent/service/register``: the same ID updates in place) with its metadata as ``Meta``
and ``Tags`` (``api.encode_meta``) and one TTL check, passed every ttl/3 s; a pass answered "unknown check" (the
agent restarted without its state, someone deregistered it) is ``InstanceGone``. ``guard`` follows the
registration (a blocking read of ``/v1/agent/service/<ID>`` on its content hash): gone, or overwritten with other
content, it is ``InstanceGone`` at once, not at the next pass. docs/consul.md, "What is registered".
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any

from ...backoff import Backoff
from ...kinds import Instance, InstanceGone, PermissionDenied, Registrar, RegistryError
from ...kinds.registration import KindRegistration
from .api import INSIDE, ConsulClient, ConsulNotFound, encode_meta, quote
from .config import ConsulConfig
from .kind import KIND

log = logging.getLogger("waypost.discovery")

#: Consul's smallest DeregisterCriticalServiceAfter (its reaper ignores shorter ones)
MIN_DEREGISTER_AFTER = 60
#: how long one blocking read of the registration waits on the agent
GUARD_WAIT = 60.0
#: the guard's retries after its read failed: soon at first (an agent back without the registration is noticed
#: within ~0.2 s), then every second
GUARD_BACKOFF = Backoff(0.2, 1.0, 0.05)


def check_service(name: str) -> None:
    if "/" in name or any(ord(c) < 32 for c in name):
        raise ValueError(f"Consul service name {name!r} cannot contain '/' or control characters")


class ConsulRegistrar(Registrar):
    """Registers instances through the agent of ``config``; ``timeout`` bounds one request (seconds)."""

    def __init__(self, config: ConsulConfig, timeout: float = 5.0) -> None:
        self.config, self.timeout = config, timeout
        self.client = ConsulClient(config, timeout=timeout * INSIDE)
        #: the definition last written of each instance id (what ``guard`` compares the agent's copy with)
        self.written: dict[str, dict[str, Any]] = {}
        #: registrations found overwritten from outside (then written again)
        self.restored = 0
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"<ConsulRegistrar {self.config.redacted}>"

    async def _request(self, method: str, path: str, what: str, **kw: Any) -> tuple[Mapping[str, str], Any]:
        return await self.client.request(method, path, what=what, within=self.timeout, **kw)

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        encode_meta(metadata)  # Consul's own limits, named

    def definition(self, instance: Instance) -> dict[str, Any]:
        tags, meta = encode_meta(instance.metadata)
        return {
            "ID": instance.id, "Name": instance.service, "Address": instance.host, "Port": instance.port,
            "Tags": tags, "Meta": meta,
            "Check": {
                "CheckID": f"service:{instance.id}", "Name": f"waypost TTL ({instance.ttl}s)",
                "TTL": f"{instance.ttl}s", "Status": "passing", "Notes": "passed by waypost every ttl/3",
                "DeregisterCriticalServiceAfter": f"{max(MIN_DEREGISTER_AFTER, 3 * instance.ttl)}s",
            },
        }

    async def register(self, instance: Instance) -> None:
        check_service(instance.service)
        # noted first: the guard's blocking read may answer with the new content before the PUT's own answer
        self.written[instance.id] = definition = self.definition(instance)
        await self._request("PUT", "/v1/agent/service/register", f"registering service {instance.id!r}",
                            body=definition)

    async def renew(self, instance: Instance) -> None:
        check = f"service:{instance.id}"
        try:  # 404: ConsulNotFound, an InstanceGone
            await self._request("PUT", f"/v1/agent/check/pass/{quote(check)}", f"passing check {check!r}")
        except RegistryError as e:
            if "does not have associated TTL" in str(e):
                raise InstanceGone(str(e)) from None
            raise

    async def deregister(self, instance: Instance) -> None:
        self.written.pop(instance.id, None)
        await self._request("PUT", f"/v1/agent/service/deregister/{quote(instance.id)}",
                            f"deregistering service {instance.id!r}")  # gone already: ConsulNotFound, an InstanceGone

    def _matches(self, instance_id: str, service: Mapping[str, Any]) -> bool:
        """Whether the agent's copy of the registration is the one last written."""
        ours = self.written.get(instance_id)
        return ours is None or (
            service.get("Service") == ours["Name"] and service.get("Address") == ours["Address"]
            and service.get("Port") == ours["Port"] and list(service.get("Tags") or []) == ours["Tags"]
            and dict(service.get("Meta") or {}) == ours["Meta"])

    async def guard(self, instance: Instance) -> None:
        content_hash, failures = "", 0
        path, what = f"/v1/agent/service/{quote(instance.id)}", f"reading service {instance.id!r}"
        while True:
            params, limit = self.client.blocking(content_hash, GUARD_WAIT)
            try:
                headers, service = await self.client.request("GET", path, params=params, what=what, timeout=limit)
                failures = 0
            except ConsulNotFound as e:
                raise InstanceGone(f"{instance.id!r} is gone from the agent ({e})") from None
            except PermissionDenied as e:
                log.warning("%r: cannot read the registration %r, so a change from outside is noticed only by the "
                            "TTL passes; grant service:read too: %s", self, instance.id, e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.debug("%r: reading the registration %r failed: %s", self, instance.id, e)
                content_hash, failures = "", failures + 1
                await asyncio.sleep(GUARD_BACKOFF.delay(failures, self._rng))
                continue
            service = service if isinstance(service, dict) else {}
            if not self._matches(instance.id, service):
                self.restored += 1
                raise InstanceGone(f"{instance.id!r} was changed from outside; putting it back")
            content_hash = headers.get("X-Consul-ContentHash", "") or str(service.get("ContentHash", ""))

    async def close(self) -> None:
        await self.client.close()


class ConsulPublisher(KindRegistration):
    """``address`` registered as an instance of service ``key`` through the Consul agent of ``registry`` (a
    ``consul://`` URL or a ``ConsulConfig``): what ``serve(registry="consul://...")`` runs, for use on its own.
    The arguments are ``waypost.Publisher``'s (``format`` is ignored: Consul has one)."""

    def __init__(self, registry: ConsulConfig | str, key: str, address: str, ttl: int = 10,
                 id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = None,
                 **kw: Any) -> None:
        url = registry.url if isinstance(registry, ConsulConfig) else registry  # a URL: drains are followed
        super().__init__(KIND, url, key, address, ttl, id, metadata, format, **kw)
        check_service(key)  # at once, as the other arguments (serve() checks it at the first registration)
