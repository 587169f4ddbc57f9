"""Publisher: keep one address registered under a key, under a lease, whatever happens to etcd.

Behaviour (go-zero's ``core/discov`` Publisher, plus what it lacks):
- ``start()`` grants a lease of ``ttl`` seconds, puts the record(s) of the chosen wire format under it,
  keeps the lease alive on the registry's shared keepalive stream, and watches its own key. A failed attempt
  (etcd unreachable, e.g. not started yet) is retried with backoff; ``RegistryUnavailable``, naming the last
  cause, once ``timeout`` seconds have passed (a refusal or an error etcd answered: at once).
- A record of the registration deleted by someone else (the address record, or go-zero's metadata side
  record): put back at once, under the same lease. Every record is guarded, so deleting one and then the
  other right after restores both.
- Lease lost (revoked from outside, expired while etcd or this process was unreachable or frozen):
  register again with a new lease, retrying every ~1 s (+-5% jitter) FOREVER; a failure is logged once
  when the state changes, not on every retry (go-zero and Kratos can stop re-registering; we never do).
- ``update_metadata(mapping)`` changes the metadata in place: same lease, same key; only the records whose
  value changes are written (go-zero: the side record alone; etcd-naming, Kratos: the address record), so
  subscribers see one change of that backend's metadata, never a removal and an add. The guard restores
  the new metadata from then on; a later re-registration uses it too.
- An operator's override (``waypost drain``, the console): the record ``_waypost/override/<key>/<value>``
  is read before each registration and watched from the first one until ``stop()``; its ``weight``
  replaces the metadata's in what is registered (and put back by the guard), ``update_metadata`` keeps
  working underneath, and deleting the record registers the own metadata again (``override.py``).
- ``pause()`` revokes the lease (the key disappears at once, traffic drains); ``resume()`` registers
  again; ``stop()`` revokes and is idempotent.
- ``exclusive=True`` (a publisher-side take-over; go-zero's exclusive is a subscriber option): before
  each registration, delete the other records under the key that hold the same address, e.g. the
  stale key of a previous incarnation of this process. A live owner of such a key will put it back.
- The go-zero key is ``<key>/<id>`` with id = ``id`` if given, else the lease id in decimal, so a new
  lease means a new key (as in go-zero).
- Unregistered for long (``outage.py``): from the lease's loss until it is registered again, the publisher
  counts the time (``unregistered_seconds``, the ``waypost_publisher_*`` gauges); after
  ``max_unregistered`` seconds it logs an ERROR and runs ``on_unregistered`` (a callable, or ``"exit"``).

All the work runs on the control loop; the sync methods block the calling thread until it is done and
the ``a*`` twins await it from any event loop (e.g. a ``grpc.aio`` server's).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import _loop, metrics
from ..backoff import cool_down
from ..errors import (
    Compacted,
    LeaseNotFound,
    PermissionDenied,
    RegistryError,
    RegistryUnavailable,
    describe_value,
    shown_key,
    suggests_keywords,
)
from ..etcd import deadline as caller_deadline
from ..netutil import check_dialable
from .formats import WireFormat, get_format
from .outage import OnUnregistered, Outage
from .override import OverrideFollower, apply_override
from .permissions import grant_hint, role_refused
from .publisher_base import REVOKE_TIMEOUT, Cleanup, PublisherBase, spawn
from .store import Registry
from .subscriber import resolve_registry

log = logging.getLogger("waypost.discovery")

#: an attempt's registry calls end this long before the attempt's own timer, so that their error says why
CAUSE_MARGIN = 0.5


class Publisher(PublisherBase):
    """Registers ``value`` (an address ``host:port``) under ``key`` (see the module docstring)."""

    @suggests_keywords("waypost.Publisher")
    def __init__(
        self, registry: Registry | str, key: str, value: str, ttl: int = 10, id: int | str | None = None,
        exclusive: bool = False, metadata: Mapping[str, Any] | None = None, format: str | WireFormat = "gozero",
        *, timeout: float = 5.0, retry_interval: float = 1.0, rng: random.Random | None = None,
        max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"publisher key must be a non-empty string, got {describe_value(key)}")
        if key.endswith("/"):
            raise ValueError(f"publisher key {shown_key(key)} ends with '/': give the service key without it "
                             f"({shown_key(key.rstrip('/') or 'greet.rpc')}); the record key adds '/<id>'")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl must be a whole number of seconds >= 1, got {describe_value(ttl)}")
        check_dialable(value, what="publisher address")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.format = get_format(format)
        #: the outage clock and the alert after ``max_unregistered`` (see ``waypost.discovery.outage``)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        self.base_key = key
        self.value = value
        self.id = id
        # validate address, id and metadata now, with a clear error, instead of on the loop later
        self.metadata = self._checked_metadata(metadata)
        self.registry = resolve_registry(registry)
        self.ttl = ttl
        self.exclusive = exclusive
        self.timeout = timeout
        self.retry_interval = retry_interval  # go-zero's 1 s; jittered +-5% with ``rng``
        self._rng = rng or random.Random()
        self._state = "new"  # new -> running <-> paused -> stopped
        self._lease = 0
        self._key: str | None = None
        self._records: list[tuple[str, bytes]] = []
        self._registered = False
        self._keepalive: Any = None
        self._guard_task: asyncio.Task[None] | None = None
        self.registrations = 0  # successful registrations so far (1 after start, +1 per recovery)
        self._writing: asyncio.Lock | None = None  # (made on the control loop) one rewrite of the records at a time
        #: an operator's weight override (``override.py``), followed from the first registration until stop()
        self.override = OverrideFollower(self.registry, key, value, self._update_late, self._rng)
        self._override_task: asyncio.Task[None] | None = None

    def _encode(self, ident: int | str, metadata: Mapping[str, Any] | None) -> list[tuple[str, bytes]]:
        """The registration's records: the format's side records first, then the address record. (Callers
        registering pass ``self._effective(...)``: the metadata with an operator's override applied.)"""
        main = self.format.encode(self.base_key, self.value, ident, metadata)
        return [*self.format.encode_side(self.base_key, self.value, ident, metadata), main]

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        self._encode(self.id if self.id is not None else 1, metadata)  # what the wire format refuses

    def _effective(self, metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return apply_override(metadata, self.override.current)

    # -- properties ------------------------------------------------------------------------------

    @property
    def key(self) -> str | None:
        """The full etcd key registered now (None while not registered)."""
        return self._key if self._registered else None

    @property
    def lease_id(self) -> int:
        """The lease in use now (0 while not registered)."""
        return self._lease if self._registered else 0

    def __repr__(self) -> str:
        return (f"<Publisher {self.base_key!r}={self.value!r} format={self.format.name} {self._state}"
                f"{' registered as ' + repr(self._key) if self._registered else ''}>")

    # -- lifecycle on the control loop -------------------------------------------------------------

    def _where(self) -> str:
        return self.registry.url

    async def _attempt(self, left: float) -> None:
        # the etcd client splits this time between its attempts and ends with its own error, naming the cause
        # (e.g. connection refused), a little before the outer timer would cut it without one
        with caller_deadline.within(left - min(CAUSE_MARGIN, left / 4)):
            await asyncio.wait_for(self._register(), left)

    async def _withdraw(self) -> None:
        log.info("%r: revoking lease %d", self, self._lease)
        await self._teardown(revoke=True)

    async def _teardown(self, revoke: bool) -> None:
        """Stop guarding and renewing; revoke the lease (bounded; else it expires by TTL)."""
        for task in (self._retry_task, self._guard_task, self._override_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._retry_task = self._guard_task = self._override_task = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        lease, self._lease = self._lease, 0
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        if revoke and lease:
            await self._revoke(lease)

    async def _revoke(self, lease: int) -> None:
        try:
            await asyncio.wait_for(self.registry.revoke(lease), REVOKE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            log.warning("%r: could not revoke lease %d (it expires within %ds): %s", self, lease, self.ttl,
                        str(e) or type(e).__name__)

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata  # what every later registration and put-back uses
        if not self._registered:
            return
        lease = self._lease
        try:
            async with self._write_lock():
                records = self._encode(self.id if self.id is not None else lease, self._effective(metadata))
                old = self._records
                self._records = records  # the guard restores these from now on
                rekey = {k for k, _ in old} != {k for k, _ in records}  # go-zero's side record comes or goes
                if rekey and self._guard_task is not None:  # the guard must watch the new set of keys
                    self._guard_task.cancel()
                rev = 0
                try:
                    for k, v in records:  # side records first, as when registering; unchanged ones are not written
                        if (k, v) not in old:
                            rev = (await asyncio.wait_for(self.registry.put(k, v, lease=lease), self.timeout)).revision
                    for k in {k for k, _ in old} - {k for k, _ in records}:
                        rev = (await asyncio.wait_for(self.registry.delete(k), self.timeout)).revision
                finally:
                    if rekey and self._lease == lease and self._state == "running":
                        self._guard_task = spawn(self._guard(lease, [k for k, _ in records], rev),
                                                  name=f"waypost-pub {records[-1][0]}")
        except LeaseNotFound as e:
            self._recover_later(e)  # registers again, with the new metadata
        except (asyncio.TimeoutError, RegistryError, RegistryUnavailable, OSError) as e:
            why = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
            raise RegistryUnavailable(
                f"could not update the metadata of {self.base_key!r}={self.value!r} in {self.registry.url} "
                f"within {self.timeout:g}s: {why}; it is registered with the next put-back or registration"
            ) from e
        log.info("%r: metadata updated to %r", self, metadata)

    # -- registering -------------------------------------------------------------------------------

    async def _evict_others(self, own_key: str) -> None:
        prefix = self.format.prefix(self.base_key)
        res = await self.registry.get(prefix, prefix=True)
        side = self.format.side_prefix(self.base_key)
        for kv in res.kvs:
            if kv.key == own_key:
                continue
            entry = self.format.decode(kv.key, kv.value)
            if entry is not None and entry.address == self.value:
                log.info("%r: exclusive: deleting %r which also holds %s", self, kv.key, self.value)
                await self.registry.delete(kv.key)
                if side is not None:
                    await self.registry.delete(side + kv.key[len(prefix):])

    async def _register(self) -> None:
        """One attempt: grant, put the records, keep alive, guard the key. Leaves nothing on failure."""
        if self.exclusive:
            # our own key when it is known before the grant (custom id, or etcd-naming's address key)
            own = self.format.record_key(self.base_key, self.value, self.id if self.id is not None else "")
            await self._evict_others(own)
        await self.override.read()  # an operator's drain applies from the first record on
        lease = await self.registry.grant(self.ttl)
        try:
            metadata = self.metadata
            effective = self._effective(metadata)
            records = self._encode(self.id if self.id is not None else lease, effective)
            main = records[-1]
            rev = 0
            for k, v in records:  # the side record first, so subscribers see metadata with the address
                try:
                    rev = (await self.registry.put(k, v, lease=lease)).revision
                except PermissionDenied as e:
                    raise (self._refused(k, e) if role_refused(e) else e) from None
            if self._state != "running":
                raise asyncio.CancelledError
        except BaseException:
            spawn(self._revoke(lease))
            raise
        self._lease, self._key, self._records = lease, main[0], records
        self._keepalive = caller_deadline.detached().run(self.registry.keep_alive, lease, self.ttl, self._on_lost)
        # the tasks that outlive this registration attempt run without its deadline
        self._guard_task = spawn(self._guard(lease, [k for k, _ in records], rev), name=f"waypost-pub {main[0]}")
        self._registered = True
        self.registrations += 1
        if self._override_task is None or self._override_task.done():
            self._override_task = spawn(self.override.run(), name=f"waypost-override {self.override.key}")
        if self.metadata is not metadata or self._effective(metadata) != effective:  # changed while written
            spawn(self._update_late())
        lasted = self.outage.end()
        log.info("%r: registered with lease %d%s", self, lease, f" after {lasted:.1f}s unregistered" if lasted else "")

    def _refused(self, key: str, e: PermissionDenied) -> PermissionDenied:
        """The refusal of a put of ``key``, naming the permission to add. A refused metadata side
        record fails the registration rather than registering the address without it: a backend
        meant to be drained (weight 0) or a canary (a small weight) would get a full share."""
        prefix, side = self._prefix_of(key)
        if side:
            return PermissionDenied(
                f"{e}; registering with metadata writes a side record: the etcd user needs readwrite on "
                f"{prefix!r} ({grant_hint(prefix, 'readwrite')}), or register without metadata")
        return PermissionDenied(f"{e}; the etcd user needs readwrite on {prefix!r} ({grant_hint(prefix, 'readwrite')})")

    def _prefix_of(self, key: str) -> tuple[str, bool]:
        """The prefix a record of this registration lies under, and whether it is a side record."""
        side = self.format.side_prefix(self.base_key)
        if side is not None and key.startswith(side):
            return side, True
        return self.format.prefix(self.base_key), False

    def _on_lost(self, lease_id: int, reason: BaseException | None) -> None:
        if not _loop.in_loop():
            _loop.call_soon(self._on_lost, lease_id, reason)
            return
        if lease_id == self._lease and self._state == "running":
            self._recover_later(reason)

    def _forget(self, reason: BaseException | None) -> Cleanup | None:
        old = self._lease
        if old:
            log.warning("%r: lease %d lost (%s); registering again", self, old, reason or "unknown reason")
        # tear down the old registration, but keep the recovery task running
        if self._guard_task is not None and self._guard_task is not asyncio.current_task():
            self._guard_task.cancel()
        self._guard_task = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._lease, self._registered = 0, False
        # Make before break: the old lease (which may still be alive in etcd, e.g. after an etcd restart, which
        # extends every lease) is revoked only once the new record is in, or when we stop trying; revoking first
        # would take this address out of every subscriber meanwhile (all of them at once when several publishers
        # recover together). A reused key (custom id) belongs to the new lease by then, so the revoke does not
        # delete it. In the background: it must not hold up anything on an unreachable etcd.
        return functools.partial(self._revoke, old) if old else None

    async def _guard(self, lease: int, keys: list[str], rev: int) -> None:
        """Watch every record of the registration (the address record and any side record: the
        registration is all of them); put the records back when someone deletes one."""
        await asyncio.gather(*(self._guard_key(lease, key, rev) for key in keys))

    async def _guard_key(self, lease: int, key: str, rev: int) -> None:
        while self._state == "running" and self._lease == lease:
            watch = self.registry.watch(key, start_revision=rev + 1)
            try:
                async for batch in watch:
                    rev = max(rev, watch.revision)
                    if any(ev.type == "delete" for ev in batch) and self._lease == lease:
                        log.warning("%r: %r was deleted from outside; putting it back", self, key)
                        rev = await self._put_back(lease) or rev
                raise RegistryError("watch of own key ended")
            except asyncio.CancelledError:
                raise
            except LeaseNotFound as e:
                self._recover_later(e)
                return
            except PermissionDenied as e:  # a role that may write but not read: register unguarded
                log.warning("%r: cannot watch its own record %r, so a deletion from outside is not put back "
                            "(the lease keeps it alive); grant read too: %s (%s)", self, key,
                            grant_hint(self._prefix_of(key)[0], "readwrite"), e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if not isinstance(e, Compacted):
                    log.debug("%r: watch of own key %r failed: %s", self, key, e)
                    await asyncio.sleep(cool_down(self._rng, self.retry_interval))
                if self._state != "running" or self._lease != lease:
                    return
                # we may have missed a delete: check, and continue from the current revision
                try:
                    res = await self.registry.get(key)
                    if not res.kvs:
                        rev = await self._put_back(lease) or res.revision
                    else:
                        rev = res.revision
                except LeaseNotFound as e2:
                    self._recover_later(e2)
                    return
                except Exception as e2:  # noqa: BLE001 (the control plane must not die)
                    log.debug("%r: checking own key %r failed: %s", self, key, e2)
            finally:
                watch.cancel()

    async def _put_back(self, lease: int) -> int:
        """Put every record again under ``lease``, side records first (as when registering), so a
        subscriber never sees the address back without its metadata."""
        obs = metrics.current
        if obs is not None:
            obs.registration_restored(self.base_key)
        rev = 0
        async with self._write_lock():  # never between an update's writes (it would put old values back)
            for k, v in self._records:
                rev = (await self.registry.put(k, v, lease=lease)).revision
        return rev
