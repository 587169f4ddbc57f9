"""A registration kept alive by renewing it: one renewal every ttl/3 s, lost only when none has worked for ttl s.

Registries without leases (a TTL check passed from outside, an instance evicted unless its heartbeats come) keep
an instance while its owner renews it. ``HeartbeatPublisher`` is that part, written once on top of
``PublisherBase``:

- the arguments every such publisher takes, checked in the same words (``ttl``, ``timeout``, a ``host:port``
  address, ``id``), the instance id (``id``, else one made from the key and the address: stable across restarts,
  so a restarted server replaces its own stale instance);
- registering: the registration written (``_write_registration``, under the write lock), then kept: the
  heartbeat task, and whatever else a kind keeps while registered (``_keep``);
- the heartbeat: a renewal (``_renew``) every ``ttl/3`` s; a failed one is retried about every
  ``retry_interval`` s and the registration counts as lost only when none has worked for ``ttl`` s (the
  registry drops it then), or at once when the registry says it no longer has it (``_gone``); lost: registered
  again (``PublisherBase._recover_later``);
- ``update_metadata``: the registration written again as it is now; ``pause``/``stop``: removed (``_remove``,
  bounded: a registry that does not answer drops it after ttl s); ``stop`` closes the client.

A kind gives the registry's client (``_new_client``), ``_default_id``, the three writes (``_write_registration``,
``_renew``, ``_remove``) and the words of its messages.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ClassVar

from ..backoff import cool_down
from ..errors import PermissionDenied, RegistryError, RegistryUnavailable, describe_value
from ..netutil import AddressError, check_dialable, parse_host_port
from .outage import OnUnregistered, Outage
from .publisher_base import REVOKE_TIMEOUT, PublisherBase

log = logging.getLogger("waypost.discovery")


def check_ttl(ttl: object) -> None:
    """ValueError unless ``ttl`` is a whole number of seconds >= 1."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
        raise ValueError(f"ttl must be a whole number of seconds >= 1, got {describe_value(ttl)}")


class HeartbeatPublisher(PublisherBase):
    """Registers ``address`` as an instance of ``key``, renewed every ``ttl/3`` s (see the module docstring)."""

    #: the registry's name in argument errors (``Consul registers host:port addresses``)
    registry_name: str
    #: the exception of the registry's client for "no such instance" (a removal finds it gone: nothing to do)
    not_found: type[Exception]
    #: whether writing the registration again (``update_metadata``) is a new registration in this registry
    update_registers: ClassVar[bool] = False

    def __init__(
        self, registry_url_or_config: Any, key: str, address: str, ttl: int, id: int | str | None,
        metadata: Mapping[str, Any] | None, format: object, *, timeout: float, max_unregistered: float | None,
        on_unregistered: OnUnregistered, retry_interval: float, rng: random.Random | None,
        clock: Callable[[], float],
    ) -> None:
        check_ttl(ttl)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not isinstance(address, str) or address.startswith(("unix:", "unix-abstract:")):
            raise ValueError(f"{self.registry_name} registers host:port addresses, got {describe_value(address)}")
        check_dialable(address, what="publisher address")
        try:
            self.host, self.port = parse_host_port(address, what="publisher address")
        except AddressError as e:
            raise ValueError(str(e)) from None
        self._check_id(id)
        self.config = self._resolve_config(registry_url_or_config)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        self.base_key = key
        self.value = address
        #: the instance's name in the registry
        self.instance_id = str(id) if id is not None else self._default_id(key)
        self.ttl = ttl
        self.timeout = float(timeout)
        self.retry_interval = retry_interval
        #: one renewal every ttl/3 s
        self.renew_interval = ttl / 3
        self.format = format  # accepted for Publisher compatibility; these registries have one format
        self.metadata = self._checked_metadata(metadata)
        self.client = self._new_client()
        self._rng = rng or random.Random()
        self._clock = clock
        self._last_ok = 0.0  # clock time of the last successful write or renewal
        #: the tasks that run while registered (the heartbeat, and what a kind adds): name -> task
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self.registrations = 0  # successful registrations (1 after start, +1 per recovery or resume)
        self.renewals = 0

    # -- what a kind gives ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _resolve_config(self, registry_url_or_config: Any) -> Any:
        """The registry's settings, as given or parsed from its registry URL."""

    @abc.abstractmethod
    def _new_client(self) -> Any:
        """The registry's client (``config``, ``timeout`` set); closed at stop."""

    @abc.abstractmethod
    def _default_id(self, key: str) -> str:
        """The instance id when none is given (``host`` and ``port`` set)."""

    @abc.abstractmethod
    async def _write_registration(self) -> None:
        """Write the registration as it is now (new, or in place of the one there)."""

    @abc.abstractmethod
    async def _renew(self) -> None:
        """One renewal."""

    @abc.abstractmethod
    async def _remove(self) -> None:
        """Remove the registration (``not_found`` when it is not there)."""

    @abc.abstractmethod
    def _renewal(self) -> str:
        """What one renewal is called in the log (``a heartbeat``)."""

    @abc.abstractmethod
    def _lost_text(self, overdue: float, e: Exception) -> str:
        """Why the registration counts as lost after ``overdue`` s without a renewal (the last failure ``e``)."""

    @abc.abstractmethod
    def _left_behind(self) -> str:
        """What a removal that failed leaves, for the log (``could not delete ... (evicted within 10s)``)."""

    @abc.abstractmethod
    def _terms(self) -> str:
        """The registration's terms, for the log (``lease 10s, renewed every 3.33s``)."""

    def _check_id(self, id: object) -> None:
        """ValueError for an ``id`` the registry cannot name an instance by."""
        if id is not None and (isinstance(id, bool) or not isinstance(id, (int, str)) or str(id) == ""):
            raise ValueError(f"id must be a non-empty string or an int, got {describe_value(id)}")

    def _gone(self, e: BaseException) -> bool:
        """Whether a failed renewal says the registry no longer has the registration (register again now)."""
        return isinstance(e, self.not_found)

    def _start_keepers(self) -> None:
        """Start what runs while registered (a kind adds its own with ``_keep``)."""
        self._keep("heartbeat", self._heartbeat)

    # -- properties ----------------------------------------------------------------------------------

    @property
    def key(self) -> str | None:
        """The instance id registered now (None while not registered)."""
        return self.instance_id if self._registered else None

    @property
    def lease_id(self) -> None:
        """No named lease here (the renewals play its role): always None."""
        return None

    @property
    def registry(self) -> Any:
        return self.config

    # -- lifecycle on the control loop ----------------------------------------------------------------

    def _keep(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``run()`` as the keeper ``name`` unless it runs already (cancelled when the registration goes)."""
        task = self._keepers.get(name)
        if task is None or task.done():
            self._keepers[name] = asyncio.get_running_loop().create_task(run())

    async def _register(self) -> None:
        """Write the registration, then keep it alive."""
        async with self._write_lock():
            await self._write_registration()
        if self._state != "running":  # paused or stopped meanwhile: the caller removes it
            return
        self._registered = True
        self._last_ok = self._clock()
        self.registrations += 1
        self.outage.end()
        self._start_keepers()
        log.debug("%r: registered (%s)", self, self._terms())

    async def _withdraw(self) -> None:
        """Stop renewing and remove the registration (bounded; else the registry drops it after ttl s)."""
        self._cancel_tasks(include_retry=True)
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        try:
            async with self._write_lock():
                await asyncio.wait_for(self._remove(), REVOKE_TIMEOUT)
        except self.not_found:
            pass  # gone already (the registry restarted, or dropped it)
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            log.warning("%r: %s: %s", self, self._left_behind(), str(e) or type(e).__name__)

    async def _close(self) -> None:
        await self.client.close()

    def _cancel_tasks(self, include_retry: bool) -> None:
        current = asyncio.current_task()
        tasks = [*self._keepers.values()] + ([self._retry_task] if include_retry else [])
        for task in tasks:
            if task is not None and task is not current:
                task.cancel()
        self._keepers.clear()
        if include_retry:
            self._retry_task = None

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata
        if self._state != "running" or not self._registered:
            return  # the next registration carries it
        try:
            async with self._write_lock():
                await asyncio.wait_for(self._write_registration(), self.timeout)
        except PermissionDenied:
            raise
        except (asyncio.TimeoutError, RegistryError, RegistryUnavailable, OSError) as e:
            raise RegistryUnavailable(f"could not update the metadata of {self.instance_id!r} in {self._where()} "
                                      f"within {self.timeout:g}s: {self._why(e)}") from e
        if self.update_registers:
            self.registrations += 1
        self._last_ok = self._clock()

    # -- keeping it alive ----------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew every ttl/3 s; gone: register again now; other failures: retry ~1 s, lost after ttl s."""
        failing = False
        while self._state == "running" and self._registered:
            delay = min(self.retry_interval, self.renew_interval) if failing else self.renew_interval
            await asyncio.sleep(cool_down(self._rng, delay))
            if self._state != "running" or not self._registered:
                return
            try:
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if self._gone(e):
                    log.debug("%r: the registry no longer has the registration (%s)", self, e)
                    self._recover_later(e)
                    return
                overdue = self._clock() - self._last_ok
                if overdue >= self.ttl:
                    self._recover_later(RegistryUnavailable(self._lost_text(overdue, e)))
                    return
                (log.warning if not failing else log.debug)(
                    "%r: %s failed (retrying; lost only after %ds without one): %s", self, self._renewal(),
                    self.ttl, str(e) or type(e).__name__)
                failing = True
                continue
            self.renewals += 1
            self._last_ok = self._clock()
            if failing:
                log.info("%r: %s works again", self, self._renewal())
            failing = False

    def _forget(self, reason: BaseException | None) -> None:
        self._cancel_tasks(include_retry=False)
        was_registered, self._registered = self._registered, False
        if was_registered:
            log.warning("%r: registration lost (%s); registering again", self, reason or "unknown reason")
