"""The registration of every kind written against ``waypost.kinds``: the state machine over any ``Registrar``.

``serve(registry="SCHEME://...")`` gets a ``KindRegistration`` for such a kind. From the registrar's four calls it
does what a registration does (``waypost.discovery.heartbeat_publisher``): register within ``timeout``, retrying
with backoff (``RegistryUnavailable`` naming the last cause when the time is up); renew every ttl/3 s, the
instance lost after ttl s without a renewal or at once on ``InstanceGone``, then registered again, forever;
pause / resume / stop idempotent; ``update_metadata`` written through ``register``; a bounded ``deregister`` at
pause and stop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..discovery.heartbeat_publisher import HeartbeatPublisher
from ..discovery.outage import OnUnregistered
from ..redaction import redact_url
from ..registry.kinds import RegistryKind, part
from . import Instance, InstanceGone, Registrar

__all__ = ["KindRegistration"]


class KindRegistration(HeartbeatPublisher):
    """``address`` registered as an instance of ``key`` in ``registry`` (a URL of ``kind``, or the settings its
    ``parse_url`` makes) through the kind's ``Registrar``. The arguments are ``waypost.Publisher``'s; ``format`` is
    accepted and ignored (a kind has one format). ``retry_interval``, ``rng`` and ``clock`` are for tests."""

    client: Registrar

    def __init__(self, kind: RegistryKind, registry: Any, key: str, address: str, ttl: int = 10,
                 id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = None, *,
                 timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
                 retry_interval: float = 1.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind
        self.registry_name = kind.title
        self.not_found = InstanceGone
        self.url = registry if isinstance(registry, str) else None
        super().__init__(registry, key, address, ttl, id, metadata, format, timeout=timeout,
                         max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)

    def __repr__(self) -> str:
        return (f"<{self.kind.title} registration {self.base_key!r}={self.value!r} at {self._where()} {self._state}"
                f"{' as ' + repr(self.instance_id) if self._registered else ''}>")

    @property
    def instance(self) -> Instance:
        """The instance as it is registered now."""
        return Instance(self.base_key, self.value, self.instance_id, MappingProxyType(dict(self.metadata or {})),
                        self.ttl)

    # -- HeartbeatPublisher's hooks, each one call of the registrar or one of the kind's words -------------

    def _resolve_config(self, registry: Any) -> Any:
        if isinstance(registry, str) and self.kind.parse_url is not None:
            return part(self.kind, "parse_url")(registry)
        return registry

    def _new_client(self) -> Registrar:
        made: Registrar | None = self.__dict__.get("client")  # made already, to check the first metadata
        if made is None:
            made = part(self.kind, "registrar")(self.config, self.timeout)
        return made

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        if "client" not in self.__dict__:  # the first check comes before HeartbeatPublisher makes the client
            self.client = self._new_client()
        self.client.check_metadata(MappingProxyType(metadata or {}))

    def _default_id(self, key: str) -> str:
        return self.kind.words.id_format.format(service=key, host=self.host, port=self.port)

    async def _write_registration(self) -> None:
        await self.client.register(self.instance)

    async def _renew(self) -> None:
        await self.client.renew(self.instance)

    async def _remove(self) -> None:
        await self.client.deregister(self.instance)

    def _where(self) -> str:
        return redact_url(self.url) if self.url is not None else repr(self.config)

    def _renewal(self) -> str:
        return self.kind.words.renewal

    def _lost_text(self, overdue: float, e: Exception) -> str:
        return self.kind.words.lost.format(renewal=self._renewal(), overdue=overdue, ttl=self.ttl,
                                           error=str(e) or type(e).__name__)

    def _left_behind(self) -> str:
        return self.kind.words.left_behind.format(instance=self.kind.words.instance, id=self.instance_id,
                                                  ttl=self.ttl)

    def _terms(self) -> str:
        return f"ttl {self.ttl}s, {self._renewal()} every {self.renew_interval:.3g}s"
