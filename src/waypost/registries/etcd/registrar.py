"""Registering in a keyed registry (etcd, memory): an address kept under a key, under a lease, whatever happens to
etcd (go-zero's ``core/discov`` Publisher, plus what it lacks). ``EtcdRegistrar`` is the kind's ``Registrar``;
the generic ``KindRegistration`` runs it (registering within the timeout, again forever after a loss, pause,
resume, stop, the operator's override), and ``Publisher`` is that registration made by hand.

- ``register`` grants a lease of ``ttl`` seconds and puts the wire format's records under it (side records first,
  so a subscriber never sees the address without its metadata), key ``<key>/<id>`` with id = ``serve(id=)`` if
  given, else the lease id in decimal (a new lease means a new key, as in go-zero). The lease is kept alive on the
  registry's shared keep-alive stream: one stream for every lease of the process.
- ``register`` again on a live registration writes in place: same lease, same key, only the records whose value
  changes (go-zero: the side record alone; etcd-naming, Kratos: the address record), so subscribers see one
  change of that backend's metadata, never a removal and an add.
- ``guard``: a record deleted by someone else is put back at once under the same lease (every record is guarded,
  so deleting one and then the other right after restores both); the lease lost (revoked from outside, expired
  while etcd or this process was unreachable or frozen) raises ``InstanceGone``: registered again at once.
- Make before break: after a loss the old lease (which may still be alive, e.g. after an etcd restart, which
  extends every lease) is revoked only once the new records are in, or at ``deregister``; revoking first would
  take this address out of every subscriber meanwhile. A reused key (custom id) belongs to the new lease by then.
- ``exclusive=True`` (a publisher-side take-over; go-zero's exclusive is a subscriber option): before each new
  lease, delete the other records under the key that hold the same address (a previous incarnation's stale key).
- A refused put names the permission to grant (``discovery/permissions.py``); the registration bounds each
  attempt's etcd calls (``waypost.etcd.deadline``), so a failed attempt names its cause (connection refused, ...).
- ``deregister`` revokes the lease (the key disappears at once); the operator's override records are followed
  through ``override_store`` (``overrides.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from ... import metrics
from ...backoff import cool_down
from ...discovery.formats import WireFormat, get_format
from ...discovery.permissions import grant_hint, role_refused
from ...discovery.store import KeepAlive, Registry
from ...discovery.subscriber import resolve_registry
from ...errors import (
    Compacted,
    LeaseNotFound,
    PermissionDenied,
    RegistryError,
    describe_value,
    shown_key,
    suggests_keywords,
)
from ...etcd import deadline as caller_deadline
from ...kind_table import kind_of
from ...kinds import Instance, InstanceGone, Registrar
from ...kinds.registration import (
    REVOKE_TIMEOUT,  # a lease left behind expires by its TTL after it
    KindRegistration,
)
from ...registration.outage import OnUnregistered
from .overrides import RegistryOverrides

__all__ = ["EtcdRegistrar", "Publisher", "check_key"]

log = logging.getLogger("waypost.discovery")


def check_key(key: object) -> str:
    """``key`` as a registration's service key; ValueError naming what is wrong."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"publisher key must be a non-empty string, got {describe_value(key)}")
    if key.endswith("/"):
        raise ValueError(f"publisher key {shown_key(key)} ends with '/': give the service key without it "
                         f"({shown_key(key.rstrip('/') or 'greet.rpc')}); the record key adds '/<id>'")
    return key


class EtcdRegistrar(Registrar):
    """One instance's records in ``registry`` (a keyed ``Registry``: etcd's or memory's) in wire format ``format``
    (see the module docstring). ``timeout`` bounds each registry call of an attempt."""

    options = ("format", "exclusive")

    def __init__(self, registry: Registry, timeout: float, *, format: str | WireFormat = "gozero",
                 exclusive: bool = False, rng: random.Random | None = None) -> None:
        if not isinstance(registry, Registry):
            raise TypeError(f"registry must be a waypost Registry or a URL string, got {type(registry).__name__}")
        self.registry = registry
        self.format = get_format(format)
        self.timeout = timeout
        self.exclusive = exclusive
        self._rng = rng or random.Random()
        self.lease = 0  # the live lease (0: none)
        self.records: list[tuple[str, bytes]] = []  # what is written under it, side records first
        self.restored = 0  # records put back after a deletion from outside
        self._key: str | None = None
        self._written_lease = 0
        self._revision = 0  # the revision the records were last written at (the guard watches from there)
        self._old: list[int] = []  # leases lost, revoked once a new registration is in (make before break)
        self._keepalive: KeepAlive | None = None
        self._gone: asyncio.Event | None = None  # set when the live lease is lost
        self._gone_reason: BaseException | None = None
        self._rekeyed: asyncio.Event | None = None  # set when the set of record keys changed (the guard follows)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the contract ------------------------------------------------------------------------------

    @property
    def lease_id(self) -> int:  # type: ignore[override]  # an int here: etcd's leases are named
        """The lease last written under (kept when it is lost, until registered again: the registration says 0
        once it knows); 0 after ``deregister``."""
        return self._written_lease

    def registered_name(self, instance: Instance) -> str:
        return self._key or instance.id

    def override_store(self) -> RegistryOverrides:
        return RegistryOverrides(self.registry, self._rng)

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        self._encode(Instance("svc", "127.0.0.1:1", "1", metadata), 1)  # what the wire format refuses

    async def register(self, instance: Instance) -> None:
        check_key(instance.service)
        self._loop = asyncio.get_running_loop()
        async with self._lock():
            if self.lease:
                try:
                    await self._rewrite(instance)
                    return
                except LeaseNotFound as e:  # lost meanwhile: registered anew, with what was to be written
                    self._lose(self.lease, e)
            await self._register_new(instance)

    async def renew(self, instance: Instance) -> None:
        """The shared keep-alive stream renews the lease; this says when it could not."""
        if not self.lease:
            raise InstanceGone(f"lease lost ({self._gone_reason or 'unknown reason'})")

    async def guard(self, instance: Instance) -> None:
        """Put back records deleted from outside; ``InstanceGone`` once the lease is lost."""
        while True:
            gone, rekeyed, lease = self._gone, self._rekeyed, self.lease
            if not lease or gone is None or rekeyed is None or gone.is_set():
                raise InstanceGone(f"lease lost ({self._gone_reason or 'unknown reason'})")
            loop = asyncio.get_running_loop()
            watchers = [loop.create_task(self._guard_key(instance, lease, key, self._revision))
                        for key, _ in self.records]
            try:
                done: list[asyncio.Task[Any]] = [loop.create_task(gone.wait()), loop.create_task(rekeyed.wait())]
                try:
                    await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in done:
                        task.cancel()
            finally:
                for task in watchers:
                    task.cancel()

    async def deregister(self, instance: Instance) -> None:
        leases = [lease for lease in (self.lease, *self._old) if lease]
        self._forget_lease()
        self._old, self._written_lease = [], 0
        for lease in leases:
            log.info("revoking lease %d of %r", lease, self._key)
            try:
                await self.registry.revoke(lease)
            except LeaseNotFound:
                pass  # gone already

    async def close(self) -> None:
        """The registry is shared: it stays open; leases still left behind are revoked (bounded)."""
        for lease in self._old:
            self._spawn(self._revoke(lease))
        self._old = []

    # -- writing -----------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        """One write of the records at a time (a put-back never between an update's writes)."""
        if self._writing is None:
            self._writing = asyncio.Lock()
        return self._writing

    def _encode(self, instance: Instance, ident: int | str) -> list[tuple[str, bytes]]:
        """The records: the format's side records first, then the address record."""
        md = dict(instance.metadata) or None
        main = self.format.encode(instance.service, instance.address, ident, md)
        return [*self.format.encode_side(instance.service, instance.address, ident, md), main]

    async def _register_new(self, instance: Instance) -> None:
        """Grant, put the records, keep alive; on failure nothing is left (the new lease is revoked)."""
        if self.exclusive:
            # our own key when it is known before the grant (custom id, or etcd-naming's address key)
            await self._evict_others(instance, self.format.record_key(instance.service, instance.address,
                                                                      instance.id))
        lease = await self.registry.grant(instance.ttl)
        try:
            records = self._encode(instance, instance.id or lease)
            revision = 0
            for key, value in records:  # side records first: subscribers see the metadata with the address
                try:
                    revision = (await self.registry.put(key, value, lease=lease)).revision
                except PermissionDenied as e:
                    raise (self._refused(instance, key, e) if role_refused(e) else e) from None
        except BaseException:
            self._spawn(self._revoke(lease))
            raise
        self.lease = self._written_lease = lease
        self.records, self._key, self._revision = records, records[-1][0], revision
        self._gone, self._gone_reason, self._rekeyed = asyncio.Event(), None, asyncio.Event()
        # the keep-alive outlives this attempt: it runs without the attempt's deadline
        self._keepalive = caller_deadline.detached().run(self.registry.keep_alive, lease, instance.ttl,
                                                         self._on_lost)
        old, self._old = self._old, []
        for stale in old:  # make before break: the new records are in
            self._spawn(self._revoke(stale))
        log.info("registered %r with lease %d", self._key, lease)

    async def _rewrite(self, instance: Instance) -> None:
        """The records of the live lease rewritten in place: only those that change."""
        old, records = self.records, self._encode(instance, instance.id or self.lease)
        self.records = records  # the guard restores these from now on
        revision = 0
        for key, value in records:  # side records first, as when registering; unchanged ones are not written
            if (key, value) not in old:
                revision = (await self.registry.put(key, value, lease=self.lease)).revision
        for key in {k for k, _ in old} - {k for k, _ in records}:  # go-zero's side record went
            revision = (await self.registry.delete(key)).revision
        self._revision = max(self._revision, revision)
        if {k for k, _ in old} != {k for k, _ in records} and self._rekeyed is not None:
            self._rekeyed.set()  # the guard watches the new set of keys
            self._rekeyed = asyncio.Event()

    async def _evict_others(self, instance: Instance, own_key: str) -> None:
        prefix = self.format.prefix(instance.service)
        side = self.format.side_prefix(instance.service)
        for kv in (await self.registry.get(prefix, prefix=True)).kvs:
            if kv.key == own_key:
                continue
            entry = self.format.decode(kv.key, kv.value)
            if entry is not None and entry.address == instance.address:
                log.info("exclusive: deleting %r which also holds %s", kv.key, instance.address)
                await self.registry.delete(kv.key)
                if side is not None:
                    await self.registry.delete(side + kv.key[len(prefix):])

    def _refused(self, instance: Instance, key: str, e: PermissionDenied) -> PermissionDenied:
        """The refusal of a put of ``key``, naming the permission to add. A refused metadata side record fails the
        registration rather than registering the address without it: a backend meant to be drained (weight 0) or
        a canary (a small weight) would get a full share."""
        prefix, side = self._prefix_of(instance.service, key)
        if side:
            return PermissionDenied(
                f"{e}; registering with metadata writes a side record: the etcd user needs readwrite on "
                f"{prefix!r} ({grant_hint(prefix, 'readwrite')}), or register without metadata")
        return PermissionDenied(f"{e}; the etcd user needs readwrite on {prefix!r} ({grant_hint(prefix, 'readwrite')})")

    def _prefix_of(self, service: str, key: str) -> tuple[str, bool]:
        """The prefix a record lies under, and whether it is a side record."""
        side = self.format.side_prefix(service)
        if side is not None and key.startswith(side):
            return side, True
        return self.format.prefix(service), False

    # -- the lease ---------------------------------------------------------------------------------

    def _on_lost(self, lease: int, reason: BaseException | None) -> None:
        """The keep-alive stream's word that ``lease`` is lost (on the control loop, or brought to it)."""
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._lose, lease, reason)
            return
        self._lose(lease, reason)

    def _lose(self, lease: int, reason: BaseException | None) -> None:
        if not lease or lease != self.lease:
            return
        log.warning("lease %d of %r lost (%s)", lease, self._key, reason or "unknown reason")
        self._old.append(lease)  # revoked once registered again (make before break)
        self._gone_reason = reason
        gone = self._gone
        self._forget_lease()
        if gone is not None:
            gone.set()

    def _forget_lease(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self.lease = 0

    async def _revoke(self, lease: int) -> None:
        try:
            await asyncio.wait_for(self.registry.revoke(lease), REVOKE_TIMEOUT)
        except LeaseNotFound:
            pass
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            log.warning("could not revoke lease %d (it expires by its TTL): %s", lease, str(e) or type(e).__name__)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task that outlives the call that made it, so it runs without that call's etcd deadline."""
        task = caller_deadline.detached().run(asyncio.get_running_loop().create_task, coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the guard ---------------------------------------------------------------------------------

    async def _guard_key(self, instance: Instance, lease: int, key: str, revision: int) -> None:
        """Watch one record from ``revision``; put every record back when someone deletes it."""
        while self.lease == lease:
            watch = self.registry.watch(key, start_revision=revision + 1)
            try:
                async for batch in watch:
                    revision = max(revision, watch.revision)
                    if any(ev.type == "delete" for ev in batch) and self.lease == lease:
                        log.warning("%r was deleted from outside; putting it back", key)
                        revision = await self._put_back(instance, lease) or revision
                raise RegistryError("watch of own key ended")
            except asyncio.CancelledError:
                raise
            except LeaseNotFound as e:
                self._lose(lease, e)
                return
            except PermissionDenied as e:  # a role that may write but not read: registered unguarded
                log.warning("cannot watch its own record %r, so a deletion from outside is not put back (the lease "
                            "keeps it alive); grant read too: %s (%s)", key,
                            grant_hint(self._prefix_of(instance.service, key)[0], "readwrite"), e)
                return
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if not isinstance(e, Compacted):
                    log.debug("watch of own key %r failed: %s", key, e)
                    await asyncio.sleep(cool_down(self._rng))
                if self.lease != lease:
                    return
                try:  # a delete may have been missed: check, and go on from the current revision
                    res = await self.registry.get(key)
                    revision = (await self._put_back(instance, lease) or res.revision) if not res.kvs else res.revision
                except LeaseNotFound as e2:
                    self._lose(lease, e2)
                    return
                except Exception as e2:  # noqa: BLE001 (the control plane must not die)
                    log.debug("checking own key %r failed: %s", key, e2)
            finally:
                watch.cancel()

    async def _put_back(self, instance: Instance, lease: int) -> int:
        """Every record again under ``lease``, side records first (never between an update's writes)."""
        obs = metrics.current
        if obs is not None:
            obs.registration_restored(instance.service)
        revision = 0
        async with self._lock():
            if self.lease != lease:
                return 0
            for key, value in self.records:
                revision = (await self.registry.put(key, value, lease=lease)).revision
        self.restored += 1
        return revision


class Publisher(KindRegistration):
    """Registers ``value`` (an address ``host:port``) under ``key`` in ``registry`` (a keyed ``Registry``, or an
    ``etcd://`` / ``memory://`` URL: ``waypost.connect`` makes it), under a lease of ``ttl`` seconds, in wire format
    ``format``; see the module docstring and ``KindRegistration``. ``key`` is the full etcd key registered now,
    ``lease_id`` its lease (0 while not registered)."""

    client: EtcdRegistrar

    @suggests_keywords("waypost.Publisher")
    def __init__(
        self, registry: Registry | str, key: str, value: str, ttl: int = 10, id: int | str | None = None,
        exclusive: bool = False, metadata: Mapping[str, Any] | None = None, format: str | WireFormat = "gozero",
        *, timeout: float = 5.0, retry_interval: float = 1.0, rng: random.Random | None = None,
        max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_key(key)
        registry = resolve_registry(registry)
        kind = kind_of(registry.url)
        assert kind is not None, registry.url
        super().__init__(kind, registry, key, value, ttl, id, metadata, format, exclusive=exclusive,
                         timeout=timeout, max_unregistered=max_unregistered, on_unregistered=on_unregistered,
                         retry_interval=retry_interval, rng=rng, clock=clock)
        self.id = id
        self.exclusive = exclusive

    def __repr__(self) -> str:
        key = self.key
        return (f"<Publisher {self.base_key!r}={self.value!r} format={self.client.format.name} {self._state}"
                f"{' registered as ' + repr(key) if key else ''}>")

