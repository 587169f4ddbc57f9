"""The registration of every kind written against ``waypost.kinds``: the state machine over any ``Registrar``.

``serve(registry="SCHEME://...")`` gets a ``KindRegistration`` for such a kind. From the registrar's four calls it
does what a registration does (``waypost.discovery.heartbeat_publisher``): register within ``timeout``, retrying
with backoff (``RegistryUnavailable`` naming the last cause when the time is up); renew every ttl/3 s, the
instance lost after ttl s without a renewal or at once on ``InstanceGone``, then registered again, forever;
pause / resume / stop idempotent; ``update_metadata`` written through ``register``; a bounded ``deregister`` at
pause and stop. When the kind's override store can ``watch`` a record, the registration follows its own
(``waypost drain``): while one is there, the instance is registered with the override's ``weight`` (read before
each registration too, so an instance started under a drain is registered drained).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..backoff import cool_down
from ..discovery.heartbeat_publisher import HeartbeatPublisher
from ..discovery.outage import OnUnregistered
from ..discovery.override import apply_override, override_key, parse_override
from ..kind_table import RegistryKind, part
from ..redaction import redact_url
from . import Instance, InstanceGone, Registrar

__all__ = ["KindRegistration"]

log = logging.getLogger("waypost.discovery")


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
        #: the operator's override in force (``waypost drain``), followed through the kind's override store
        self.override: dict[str, Any] | None = None
        self._store: Any = None  # the override store opened before registering, handed to the follower
        super().__init__(registry, key, address, ttl, id, metadata, format, timeout=timeout,
                         max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)

    def __repr__(self) -> str:
        return (f"<{self.kind.title} registration {self.base_key!r}={self.value!r} at {self._where()} {self._state}"
                f"{' as ' + repr(self.instance_id) if self._registered else ''}>")

    @property
    def instance(self) -> Instance:
        """The instance as it is registered now."""
        metadata = apply_override(self.metadata, self.override) or {}
        return Instance(self.base_key, self.value, self.instance_id, MappingProxyType(metadata), self.ttl)

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

    async def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        await super()._close()

    # -- following the operator's override --------------------------------------------------------------

    async def _attempt(self, left: float) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        if self.url is not None and self.kind.override_store is not None and "override" not in self._keepers:
            await self._read_override(left / 2)
        await super()._attempt(left - (loop.time() - began))

    async def _read_override(self, within: float) -> None:
        """The record in force, before the instance is written (a store that cannot say within ``within`` s
        leaves it to the follower, once registered)."""
        assert self.url is not None
        try:
            store = self._store = self._store or part(self.kind, "override_store")(self.url)
            if not hasattr(store, "watch"):
                return
            records = store.watch(override_key(self.base_key, self.value))
            try:
                value = await asyncio.wait_for(anext(records), within)
            finally:
                if hasattr(records, "aclose"):
                    await records.aclose()
        except Exception as e:  # noqa: BLE001 (registering comes first)
            log.debug("%r: could not read the override record before registering (followed once registered): %s",
                      self, str(e) or type(e).__name__)
            return
        self.override = parse_override(value) if value is not None else None

    def _start_keepers(self) -> None:
        super()._start_keepers()
        if type(self.client).guard is not Registrar.guard:
            self._keep("guard", self._guard)
        if self.url is not None and self.kind.override_store is not None:
            self._keep("override", self._follow_override)

    async def _guard(self) -> None:
        """The registrar's ``guard``: the instance gone or changed from outside is registered again at once."""
        try:
            await self.client.guard(self.instance)
        except InstanceGone as e:
            if self._state == "running" and self._registered:
                log.debug("%r: the registry no longer has the registration as written (%s)", self, e)
                self._recover_later(e)

    async def _follow_override(self) -> None:
        """Follow this instance's override record while registered; a change is written at once. A store without
        ``watch`` has nothing to follow; a failure is retried every ~1 s (the registration stays as it is)."""
        assert self.url is not None
        store, self._store = self._store or part(self.kind, "override_store")(self.url), None
        try:
            if not hasattr(store, "watch"):
                return
            key = override_key(self.base_key, self.value)
            while self._state == "running" and self._registered:
                try:
                    async for value in store.watch(key):
                        await self._take_override(parse_override(value) if value is not None else None)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 (the control plane must not die)
                    log.warning("%r: following the override record %r failed (retrying): %s", self, key,
                                str(e) or type(e).__name__)
                await asyncio.sleep(cool_down(self._rng))
        finally:
            await store.close()

    async def _take_override(self, record: dict[str, Any] | None) -> None:
        if record == self.override:
            return
        previous, self.override = self.override, record
        if self._state == "running" and self._registered:
            try:
                async with self._write_lock():
                    await asyncio.wait_for(self._write_registration(), self.timeout)
            except BaseException:
                self.override = previous  # not written: the next look at the record tries again
                raise
        log.info("%r: override %s", self, f"weight {record['weight']}" if record else "removed")
