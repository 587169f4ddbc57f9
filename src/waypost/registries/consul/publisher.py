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

from ...backoff import Backoff, cool_down
from ...discovery.heartbeat_publisher import HeartbeatPublisher
from ...discovery.outage import OnUnregistered
from ...discovery.override import apply_override
from ...errors import PermissionDenied, RegistryError, describe_value, shown_key, suggests_keywords
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


class ConsulPublisher(HeartbeatPublisher):
    """Registers ``address`` as an instance of service ``key`` in Consul (see the module docstring)."""

    registry_name = "Consul"
    not_found = ConsulNotFound
    config: ConsulConfig
    client: ConsulClient

    @suggests_keywords("waypost.ConsulPublisher")
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
        super().__init__(registry_url_or_config, key, address, ttl, id, metadata, format, timeout=timeout,
                         max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)
        self.check_id = f"service:{self.service_id}"
        self.deregister_after = max(MIN_DEREGISTER_AFTER, 3 * ttl)
        self.restored = 0  # registrations put back after someone overwrote them
        #: an operator's weight override: the KV key ``_waypost/override/<key>/<address>`` (``override.py``)
        self.override = ConsulOverrideFollower(self.client, key, address, self._update_late, self._rng)
        self._override_task: asyncio.Task[None] | None = None

    def _resolve_config(self, registry_url_or_config: ConsulConfig | str) -> ConsulConfig:
        return resolve_config(registry_url_or_config)

    def _new_client(self) -> ConsulClient:
        return ConsulClient(self.config, timeout=self.timeout)

    def _default_id(self, key: str) -> str:
        return f"{key}-{self.host}-{self.port}"

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
    def service_id(self) -> str:
        """The instance's ID in Consul (``instance_id``: Consul calls it the service ID)."""
        return self.instance_id

    @property
    def passes(self) -> int:
        """Passes of the TTL check that worked (``renewals``)."""
        return self.renewals

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

    def _terms(self) -> str:
        return f"TTL {self.ttl}s, deregistered after {self.deregister_after}s critical"

    def _why(self, e: BaseException) -> str:
        """A timeout of our own bound (``wait_for``) in the client's words, as a dial says it: which agent, how
        far the request got (accepted the connection but did not answer, ...), within the publisher's timeout."""
        if isinstance(e, asyncio.TimeoutError) and self.client.stalled is not None:
            how, what = self.client.stalled
            return str(self.client.no_answer(how, self.timeout, what))
        return super()._why(e)

    async def _register(self) -> None:
        await self.override.read()  # an operator's drain applies from the first registration on
        await super()._register()

    def _start_keepers(self) -> None:
        super()._start_keepers()
        self._keep("guard", self._guard)
        if self._override_task is None or self._override_task.done():  # follows the override across losses
            self._override_task = asyncio.get_running_loop().create_task(self.override.run())

    async def _write_registration(self) -> None:
        """PUT the registration (with its check, passing); the same ID updates it in place."""
        await self.client.register_service(self._definition())

    async def _remove(self) -> None:
        await self.client.deregister_service(self.service_id)

    def _left_behind(self) -> str:
        return (f"could not deregister {self.service_id!r} (it leaves the passing list within {self.ttl}s and the "
                f"catalog after {self.deregister_after}s more)")

    async def _withdraw(self) -> None:
        if self._override_task is not None:
            self._override_task.cancel()
            self._override_task = None
        await super()._withdraw()

    # -- keeping it alive ----------------------------------------------------------------------------------

    def _gone(self, e: BaseException) -> bool:
        """Whether a failed pass says the agent no longer has our check (re-register now)."""
        if isinstance(e, ConsulNotFound):
            return True
        return isinstance(e, RegistryError) and "does not have associated TTL" in str(e)

    async def _renew(self) -> None:
        await self.client.pass_check(self.check_id)

    def _renewal(self) -> str:
        return f"passing {self.check_id!r}"

    def _lost_text(self, overdue: float, e: Exception) -> str:
        return (f"no pass of {self.check_id!r} succeeded for {overdue:.1f}s (TTL {self.ttl}s), so the check is "
                f"critical: {e}")

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
                        await self._write_registration()
                    self.restored += 1
                except Exception as e:  # noqa: BLE001
                    log.debug("%r: putting back %r failed: %s", self, self.service_id, e)
                    await asyncio.sleep(cool_down(self._rng, self.retry_interval))
                content_hash = ""
