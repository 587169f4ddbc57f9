"""ConsulPublisher: keep one address registered as an instance of a service in Consul, whatever happens to the
agent. The same public interface as ``waypost.discovery.Publisher`` (what ``serve()`` drives).

What is registered (``PUT /v1/agent/service/register`` on the agent of the registry URL):

- ``Name`` = ``key`` (the service), ``ID`` = ``id`` if given, else ``<key>-<host>-<port>`` (stable across
  restarts of the process, so a restarted server replaces its own stale instance instead of adding one);
- ``Address``/``Port`` from ``address`` (``host:port``; an IPv6 host without brackets);
- ``Meta`` from ``metadata``: strings as they are, other values as JSON text (``waypost.registries.consul.api.encode_meta``;
  the resolver decodes them back), ``metadata["tags"]`` (a list of strings) as the ``Tags``; no tags otherwise;
- one TTL check (``CheckID`` ``service:<ID>``, ``TTL`` = ``ttl`` s, registered passing) that this publisher
  passes every ``ttl/3`` s, with ``DeregisterCriticalServiceAfter`` = max(1 min, 3 * ttl) (Consul's minimum is
  1 minute), so the instance of a crashed process leaves the passing list after ``ttl`` s and the catalog a
  minute or so later.

Behaviour:

- ``start()`` registers, retrying while the agent cannot be reached (an agent that starts a little after this
  server is waited for), and raises ``RegistryUnavailable`` naming the last cause if this does not succeed
  within ``timeout`` s (``PermissionDenied`` as it is, at once, when the ACL token may not register the
  service); the same at ``resume()``, which then goes on in the background.
- A pass that fails (agent slow or unreachable) is retried about every second; the registration counts as lost
  only when no pass has succeeded for ``ttl`` s (the TTL deadline, when Consul marks the check critical), so a
  slow link causes no churn. Lost, or gone from the agent (a pass answers 404 "Unknown check ID": the agent
  restarted without its state, or someone deregistered the instance; the guard's blocking read of
  ``/v1/agent/service/<ID>`` answers 404): registered again at once, then retried every ~1 s (+-5% jitter)
  forever, with the outage clock (``outage``) running from the loss until registered again.
- The guard also puts the registration back when someone overwrites it with other content (same ID).
- ``update_metadata(md)`` registers again with the same ID: an in-place update, subscribers see one change of
  that instance's metadata, never a removal and an add.
- ``pause()`` deregisters (the instance disappears at once), ``resume()`` registers again; ``stop()``
  deregisters (bounded; if the agent is unreachable then, DeregisterCriticalServiceAfter cleans up) and is
  idempotent.
- An operator's override (``waypost drain``, the console): the KV key ``_waypost/override/<key>/<address>``,
  read before each registration and followed by a blocking query; its ``weight`` replaces the metadata's in
  what is registered (``waypost.discovery.override``).
- ``format`` is accepted for interface compatibility with ``Publisher`` and ignored (Consul has one format);
  ``lease_id`` is always None (Consul has no leases: the TTL check plays their role).

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

from ...backoff import Backoff
from ...discovery.group import cool_down
from ...discovery.outage import OnUnregistered, Outage
from ...discovery.override import apply_override
from ...discovery.publisher_base import REVOKE_TIMEOUT, PublisherBase
from ...errors import PermissionDenied, RegistryError, RegistryUnavailable, describe_value, shown_key
from ...netutil import AddressError, check_dialable, parse_host_port
from .api import ConsulClient, ConsulNotFound, decode_meta, encode_meta
from .config import ConsulConfig, resolve_config
from .overrides import ConsulOverrideFollower

log = logging.getLogger("waypost.discovery")


#: Consul's smallest DeregisterCriticalServiceAfter (its reaper ignores shorter ones)
MIN_DEREGISTER_AFTER = 60
#: how long one blocking read of our own registration waits on the agent
GUARD_WAIT = 60.0
#: the guard's first retry after its read failed (doubling up to retry_interval)
GUARD_FIRST_RETRY = 0.2


class ConsulPublisher(PublisherBase):
    """Registers ``address`` as an instance of service ``key`` in Consul (see the module docstring)."""

    def __init__(
        self, registry_url_or_config: ConsulConfig | str, key: str, address: str, ttl: int = 10,
        id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = "gozero",
        *, timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        retry_interval: float = 1.0, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"publisher key (the Consul service name) must be a non-empty string, got "
                             f"{describe_value(key)}")
        if "/" in key or any(ord(c) < 32 for c in key):
            raise ValueError(f"Consul service name {shown_key(key)} cannot contain '/' or control characters")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl must be a whole number of seconds >= 1, got {describe_value(ttl)}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not isinstance(address, str) or address.startswith(("unix:", "unix-abstract:")):
            raise ValueError(f"Consul registers host:port addresses, got {describe_value(address)}")
        check_dialable(address, what="publisher address")
        try:
            self.host, self.port = parse_host_port(address, what="publisher address")
        except AddressError as e:
            raise ValueError(str(e)) from None
        if id is not None and (isinstance(id, bool) or not isinstance(id, (int, str)) or str(id) == ""):
            raise ValueError(f"id must be a non-empty string or an int, got {describe_value(id)}")
        self.config = resolve_config(registry_url_or_config)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        self.base_key = key
        self.value = address
        self.service_id = str(id) if id is not None else f"{key}-{self.host}-{self.port}"
        self.check_id = f"service:{self.service_id}"
        self.ttl = ttl
        self.timeout = float(timeout)
        self.retry_interval = retry_interval
        #: passes of the TTL check, every ttl/3 s
        self.pass_interval = ttl / 3
        self.deregister_after = max(MIN_DEREGISTER_AFTER, 3 * ttl)
        self.format = format  # accepted for Publisher compatibility; Consul has one format
        self.metadata = self._checked_metadata(metadata)
        self.client = ConsulClient(self.config, timeout=self.timeout)
        self._rng = rng or random.Random()
        self._clock = clock
        self._last_ok = 0.0  # clock time of the last successful register or pass
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._guard_task: asyncio.Task[None] | None = None
        self.registrations = 0  # successful registrations (1 after start, +1 per recovery or resume)
        self.passes = 0
        self.restored = 0  # registrations put back after someone overwrote them
        #: an operator's weight override: the KV key ``_waypost/override/<key>/<address>`` (``override.py``)
        self.override = ConsulOverrideFollower(self.client, key, address, self._update_late, self._rng)
        self._override_task: asyncio.Task[None] | None = None

    # -- validation ----------------------------------------------------------------------------------------

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        if metadata:
            encode_meta(metadata)  # Consul's own limits, named

    def _effective(self) -> dict[str, Any] | None:
        """The metadata registered: the own metadata with an operator's override applied."""
        return apply_override(self.metadata, self.override.current)

    def _definition(self) -> dict[str, Any]:
        tags, meta = encode_meta(self._effective())
        return {
            "ID": self.service_id, "Name": self.base_key, "Address": self.host, "Port": self.port,
            "Tags": tags, "Meta": meta,
            "Check": {
                "CheckID": self.check_id, "Name": f"waypost TTL ({self.ttl}s)", "TTL": f"{self.ttl}s",
                "Status": "passing", "Notes": "passed by waypost's ConsulPublisher every ttl/3",
                "DeregisterCriticalServiceAfter": f"{self.deregister_after}s",
            },
        }

    def _matches(self, service: Mapping[str, Any]) -> bool:
        """Whether the agent's copy of the registration is ours as we registered it."""
        tags, meta = encode_meta(self._effective())
        return (service.get("Service") == self.base_key and service.get("Address") == self.host
                and service.get("Port") == self.port and list(service.get("Tags") or []) == tags
                and dict(service.get("Meta") or {}) == meta)

    # -- properties ----------------------------------------------------------------------------------------

    @property
    def key(self) -> str | None:
        """The instance ID registered now (None while not registered)."""
        return self.service_id if self._registered else None

    @property
    def lease_id(self) -> None:
        """Consul has no leases (the TTL check plays their role): always None."""
        return None

    @property
    def registry(self) -> ConsulConfig:
        return self.config

    def decoded_metadata(self) -> dict[str, Any]:
        """The metadata as a resolver reads it back (``encode_meta`` then ``decode_meta``)."""
        tags, meta = encode_meta(self._effective())
        return decode_meta(meta, tags)

    def __repr__(self) -> str:
        return (f"<ConsulPublisher {self.base_key!r}={self.value!r} at {self.config.redacted} {self._state}"
                f"{' registered as ' + repr(self.service_id) if self._registered else ''}>")

    # -- lifecycle on the control loop ----------------------------------------------------------------------

    def _where(self) -> str:
        return f"consul at {self.config.base_url}"

    def _why(self, e: BaseException) -> str:
        """A timeout of our own bound (``wait_for``) in the client's words, as a dial says it: which agent, how
        far the request got (accepted the connection but did not answer, ...), within the publisher's timeout."""
        if isinstance(e, asyncio.TimeoutError) and self.client.stalled is not None:
            how, what = self.client.stalled
            return str(self.client.no_answer(how, self.timeout, what))
        return super()._why(e)

    async def _register(self) -> None:
        """PUT the registration (with its check, passing) and start keeping it alive."""
        await self.override.read()  # an operator's drain applies from the first registration on
        async with self._write_lock():
            await self.client.register_service(self._definition())
        if self._state != "running":  # paused or stopped meanwhile: the caller deregisters
            return
        self._registered = True
        self._last_ok = self._clock()
        self.registrations += 1
        self.outage.end()
        loop = asyncio.get_running_loop()
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = loop.create_task(self._heartbeat())
        if self._guard_task is None or self._guard_task.done():
            self._guard_task = loop.create_task(self._guard())
        if self._override_task is None or self._override_task.done():
            self._override_task = loop.create_task(self.override.run())
        log.debug("%r: registered (TTL %ds, deregistered after %ds critical)", self, self.ttl, self.deregister_after)

    async def _withdraw(self) -> None:
        await self._teardown(deregister=True)

    async def _close(self) -> None:
        await self.client.close()

    async def _teardown(self, deregister: bool) -> None:
        """Stop passing and guarding; deregister (bounded; else the check goes critical after ttl and the
        instance is reaped after DeregisterCriticalServiceAfter)."""
        self._cancel_tasks(include_retry=True)
        if self._override_task is not None:
            self._override_task.cancel()
            self._override_task = None
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        if deregister:
            try:
                async with self._write_lock():
                    await asyncio.wait_for(self.client.deregister_service(self.service_id), REVOKE_TIMEOUT)
            except ConsulNotFound:
                pass  # gone already (agent restarted)
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.warning("%r: could not deregister %r (it leaves the passing list within %ds and the catalog "
                            "after %ds more): %s", self, self.service_id, self.ttl, self.deregister_after,
                            str(e) or type(e).__name__)

    def _cancel_tasks(self, include_retry: bool) -> None:
        current = asyncio.current_task()
        tasks = [self._heartbeat_task, self._guard_task] + ([self._retry_task] if include_retry else [])
        for task in tasks:
            if task is not None and task is not current:
                task.cancel()
        self._heartbeat_task = self._guard_task = None
        if include_retry:
            self._retry_task = None

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata
        if self._state != "running" or not self._registered:
            return  # the next registration carries it
        try:
            async with self._write_lock():
                await asyncio.wait_for(self.client.register_service(self._definition()), self.timeout)
        except PermissionDenied:
            raise
        except (asyncio.TimeoutError, RegistryError, RegistryUnavailable, OSError) as e:
            why = self._why(e)
            raise RegistryUnavailable(f"could not update the metadata of {self.service_id!r} in consul at "
                                      f"{self.config.base_url} within {self.timeout:g}s: {why}") from e
        self._last_ok = self._clock()

    # -- keeping it alive ----------------------------------------------------------------------------------

    def _gone(self, e: BaseException) -> bool:
        """Whether a failed pass says the agent no longer has our check (re-register now)."""
        if isinstance(e, ConsulNotFound):
            return True
        return isinstance(e, RegistryError) and "does not have associated TTL" in str(e)

    async def _heartbeat(self) -> None:
        """Pass the TTL check every ttl/3 s; on failure retry ~1 s; lost when nothing passed for ttl s."""
        failing = False
        while self._state == "running" and self._registered:
            delay = min(self.retry_interval, self.pass_interval) if failing else self.pass_interval
            await asyncio.sleep(cool_down(self._rng, delay))
            if self._state != "running" or not self._registered:
                return
            try:
                await self.client.pass_check(self.check_id)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if self._gone(e):
                    log.debug("%r: the agent no longer has check %r (%s)", self, self.check_id, e)
                    self._recover_later(e)
                    return
                overdue = self._clock() - self._last_ok
                if overdue >= self.ttl:
                    self._recover_later(RegistryUnavailable(
                        f"no pass of {self.check_id!r} succeeded for {overdue:.1f}s (TTL {self.ttl}s), so the "
                        f"check is critical: {e}"))
                    return
                (log.warning if not failing else log.debug)(
                    "%r: passing %r failed (retrying; lost only after %ds without a pass): %s", self,
                    self.check_id, self.ttl, str(e) or type(e).__name__)
                failing = True
                continue
            self.passes += 1
            self._last_ok = self._clock()
            if failing:
                log.info("%r: passing %r works again", self, self.check_id)
            failing = False

    async def _guard(self) -> None:
        """Follow our own registration on the agent (a blocking read on its content hash): gone -> register
        again now; overwritten with other content -> put ours back."""
        content_hash = ""
        failures = 0
        while self._state == "running" and self._registered:
            try:
                content_hash, service = await self.client.agent_service(
                    self.service_id, hash=content_hash, wait=GUARD_WAIT)
                failures = 0
            except asyncio.CancelledError:
                raise
            except ConsulNotFound as e:
                if self._state == "running" and self._registered:
                    log.debug("%r: %r is gone from the agent (%s)", self, self.service_id, e)
                    self._recover_later(e)
                return
            except PermissionDenied as e:
                log.warning("%r: cannot read its own registration, so a change from outside is noticed only by "
                            "the TTL passes; grant service:read too: %s", self, e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                log.debug("%r: reading own registration failed: %s", self, e)
                content_hash = ""
                # soon at first: an agent that restarted without our registration is noticed within ~0.2 s
                # of being back; then every retry_interval
                failures += 1
                first = min(GUARD_FIRST_RETRY, self.retry_interval)
                await asyncio.sleep(Backoff(first, self.retry_interval, 0.05).delay(failures, self._rng))
                continue
            if self._state == "running" and self._registered and not self._matches(service):
                log.warning("%r: %r was changed from outside; putting it back", self, self.service_id)
                try:
                    async with self._write_lock():
                        await self.client.register_service(self._definition())
                    self.restored += 1
                except Exception as e:  # noqa: BLE001
                    log.debug("%r: putting back %r failed: %s", self, self.service_id, e)
                    await asyncio.sleep(cool_down(self._rng, self.retry_interval))
                content_hash = ""

    def _forget(self, reason: BaseException | None) -> None:
        self._cancel_tasks(include_retry=False)
        was_registered, self._registered = self._registered, False
        if was_registered:
            log.warning("%r: registration lost (%s); registering again", self, reason or "unknown reason")
