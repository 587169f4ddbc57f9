"""The registration of every kind written against ``waypost.kinds``: the state machine over any ``Registrar``.

``serve(registry="SCHEME://...")`` gets a ``KindRegistration`` for such a kind. Registries without leases (a TTL
check passed from outside, an instance evicted unless its heartbeats come) keep an instance while its owner renews
it; from the registrar's four calls this does what such a registration does, written once:

- the arguments checked in the same words for every kind (``ttl``, ``timeout``, a ``host:port`` address, ``id``);
  the instance id is ``id``, else one made from the key and the address (the kind's ``id_format``): stable across
  restarts, so a restarted server replaces its own stale instance;
- register within ``timeout``, retrying with backoff (``RegistryUnavailable`` naming the last cause when the time
  is up); then kept: the heartbeat, the registrar's ``guard`` when it has one, the override follower;
- the heartbeat: a renewal every ``ttl/3`` s; a failed one is retried about every ``retry_interval`` s and the
  registration counts as lost only when none has worked for ``ttl`` s (the registry drops it then), or at once on
  ``InstanceGone``; lost: registered again (``_recover_later``), forever;
- pause / resume / stop idempotent; ``update_metadata`` written through ``register``; a bounded ``deregister`` at
  pause and stop (a registry that does not answer drops the instance after ttl s); ``stop`` closes the registrar.

When the kind's override store can ``watch`` a record, the registration follows its own (``waypost drain``): while
one is there, the instance is registered with the override's ``weight`` (read before each registration too, so an
instance started under a drain is registered drained).

Registering at start or resume: retried with backoff (``FIRST_RETRY`` s doubling to ``MAX_RETRY`` s, jittered)
until ``timeout`` runs out, so a registry that starts a little after this server (docker compose and Kubernetes
start them together) is waited for. A refusal (``PermissionDenied``) or an answer that another attempt would get
again (``RegistryError``) raises at once; when the time is up, ``RegistryUnavailable`` names the last cause. A
resume that fails goes on in the background (``_recover_later``). The public face (blocking methods, ``a*`` twins,
context managers) is ``RegistrationFaces``' (``waypost.registration.contract``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

from .. import metrics
from ..backoff import Backoff, cool_down
from ..discovery.override import apply_override, override_key, parse_override
from ..errors import PermissionDenied, RegistryError, RegistryUnavailable, describe_value
from ..etcd import deadline as caller_deadline
from ..kind_table import RegistryKind, part
from ..netutil import AddressError, check_dialable, parse_host_port
from ..redaction import redact_url
from ..registration.contract import RegistrationFaces
from ..registration.outage import OnUnregistered, Outage, track, untrack
from . import Instance, InstanceGone, Registrar

__all__ = ["REVOKE_TIMEOUT", "KindRegistration", "check_json", "spawn"]

log = logging.getLogger("waypost.discovery")

#: an attempt's etcd calls end this long before the attempt's own timer, so that their error says why
CAUSE_MARGIN = 0.5

#: bound on a deregistration at pause/stop (after it, the TTL / session expiry cleans up)
REVOKE_TIMEOUT = 2.0
#: start-up retries: the first pause, doubling up to the last, +-5% (``_register_within_timeout``)
FIRST_RETRY = 0.25
MAX_RETRY = 2.0
#: no new attempt with less time left than this after the pause; and at most this many attempts
MIN_START_ATTEMPT = 0.2
#: the pauses between registering attempts (go-zero's +-5% jitter)
START_BACKOFF = Backoff(first=FIRST_RETRY, cap=MAX_RETRY, jitter=0.05)
MAX_START_ATTEMPTS = 1000


def check_json(value: Any, where: str, depth: int = 0) -> None:
    """TypeError/ValueError naming the field of ``value`` (at ``where``) that JSON cannot carry."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}, which JSON cannot carry (use a finite number or a string)")
        return
    if depth > 32:
        raise ValueError(f"{where}: metadata nested more than 32 levels deep")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {describe_value(k)} is not a string (JSON object keys are strings)")
            check_json(v, f"{where}[{k!r}]", depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_json(v, f"{where}[{i}]", depth + 1)
        return
    raise TypeError(f"{where} is of type {type(value).__name__}, which is not JSON-serialisable "
                    "(use str, int, float, bool, None, lists and dicts)")


def spawn(coro: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
    """A task on the running loop that does not inherit a caller's etcd deadline (``etcd.deadline``): a
    publisher's guard, retries and revokes outlive the call that started them."""
    return caller_deadline.detached().run(asyncio.get_running_loop().create_task, coro, name=name)


class KindRegistration(RegistrationFaces):
    """``address`` registered as an instance of ``key`` in ``registry`` (a URL of ``kind``, or the settings its
    ``parse_url`` makes) through the kind's ``Registrar``, renewed every ``ttl/3`` s (see the module docstring).
    The arguments are ``waypost.Publisher``'s; ``format`` and ``exclusive`` reach a registrar that takes them
    (``Registrar`` ``options``: etcd's), else ``format`` is ignored (a kind has one format).
    ``retry_interval``, ``rng`` and ``clock`` are for tests."""

    client: Registrar
    _retry_task: asyncio.Task[None] | None = None
    _writing: asyncio.Lock | None = None
    _extra_wait = REVOKE_TIMEOUT + 10

    def __init__(self, kind: RegistryKind, registry: Any, key: str, address: str, ttl: int = 10,
                 id: int | str | None = None, metadata: Mapping[str, Any] | None = None, format: object = None, *,
                 exclusive: bool = False, timeout: float = 5.0, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None,
                 retry_interval: float = 1.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind
        self.url = registry if isinstance(registry, str) else None
        #: the operator's override in force (``waypost drain``), followed through the kind's override store
        self.override: dict[str, Any] | None = None
        self._store: Any = None  # the override store opened before registering, handed to the follower
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"ttl must be a whole number of seconds >= 1, got {describe_value(ttl)}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not isinstance(address, str) or address.startswith(("unix:", "unix-abstract:")):
            raise ValueError(f"{kind.title} registers host:port addresses, got {describe_value(address)}")
        check_dialable(address, what="publisher address")
        try:
            self.host, self.port = parse_host_port(address, what="publisher address")
        except AddressError as e:
            raise ValueError(str(e)) from None
        if id is not None and (isinstance(id, bool) or not isinstance(id, (int, str)) or str(id) == ""):
            raise ValueError(f"id must be a non-empty string or an int, got {describe_value(id)}")
        self.config = (part(kind, "parse_url")(registry) if self.url is not None and kind.parse_url is not None
                       else registry)
        self.outage = Outage(self, max_unregistered, on_unregistered, clock)
        self.base_key = key
        self.value = address
        #: the instance's name in the registry
        self.instance_id = (str(id) if id is not None
                            else kind.words.id_format.format(service=key, host=self.host, port=self.port))
        self.ttl = ttl
        self.timeout = float(timeout)
        self.retry_interval = retry_interval
        #: one renewal every ttl/3 s
        self.renew_interval = ttl / 3
        self._options = {"format": format, "exclusive": exclusive}
        self.metadata = self._checked_metadata(metadata)  # makes the registrar (``client``) first
        #: the registrar's wire format where it has several (etcd), else what was given (accepted and ignored)
        self.format = getattr(self.client, "format", format)
        self._rng = rng or random.Random()
        self._clock = clock
        self._last_ok = 0.0  # clock time of the last successful write or renewal
        #: the tasks that run while registered (the heartbeat, the guard, the override follower): name -> task
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self.registrations = 0  # successful registrations (1 after start, +1 per recovery or resume)
        self.renewals = 0

    def __repr__(self) -> str:
        return (f"<{self.kind.title} registration {self.base_key!r}={self.value!r} at {self._where()} {self._state}"
                f"{' as ' + repr(self.instance_id) if self._registered else ''}>")

    # -- properties ----------------------------------------------------------------------------------

    @property
    def instance(self) -> Instance:
        """The instance as it is registered now."""
        metadata = apply_override(self.metadata, self.override) or {}
        return Instance(self.base_key, self.value, self.instance_id, MappingProxyType(metadata), self.ttl)

    @property
    def key(self) -> str | None:
        """The instance's name in the registry now (``Registrar.registered_name``: the instance id; etcd: the
        record's key), None while not registered."""
        return self.client.registered_name(self.instance) if self._registered else None

    @property
    def lease_id(self) -> int | None:
        """The lease the instance is kept under (``Registrar.lease_id``; etcd: 0 while not registered); None for
        a registry without named leases (the renewals play its role)."""
        lease = self.client.lease_id
        return lease if lease is None or self._registered else 0

    @property
    def registry(self) -> Any:
        return self.config

    # -- one attempt, its tear-down, and the checks ------------------------------------------------------

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        if "client" not in self.__dict__:  # the first check, in __init__, makes the registrar that answers it
            factory = part(self.kind, "registrar")
            taken = getattr(factory, "options", ())
            if self._options["exclusive"] and "exclusive" not in taken:
                raise ValueError(f"exclusive=True is an option of the keyed registries (etcd, memory), not of "
                                 f"{self.kind.title}: register without it")
            self.client = factory(self.config, self.timeout, **{k: v for k, v in self._options.items()
                                                                     if k in taken and v is not None})
        self.client.check_metadata(MappingProxyType(metadata or {}))

    def _where(self) -> str:
        url = self.url if self.url is not None else getattr(self.config, "url", None)  # a Registry object's
        return redact_url(url) if isinstance(url, str) else repr(self.config)

    def _follows_overrides(self) -> bool:
        """Whether there is an override store to follow: the kind's for a URL, else the registrar's own."""
        if self.url is not None and self.kind.override_store is not None:
            return True
        return type(self.client).override_store is not Registrar.override_store

    def _open_store(self) -> Any:
        if self.url is not None and self.kind.override_store is not None:
            return part(self.kind, "override_store")(self.url)
        return self.client.override_store()

    async def _attempt(self, left: float) -> None:
        # a kind over waypost's etcd client (etcd, memory): its calls end with the client's own error, naming the
        # cause (e.g. connection refused), a little before the attempt's timer would cut them without one
        with caller_deadline.within(left - min(CAUSE_MARGIN, left / 4)):
            loop = asyncio.get_running_loop()
            began = loop.time()
            if self._follows_overrides() and "override" not in self._keepers:
                await self._read_override(left)
            await asyncio.wait_for(self._register(), left - (loop.time() - began))

    async def _register(self) -> None:
        """Write the registration, then keep it alive."""
        async with self._write_lock():
            await self.client.register(self.instance)
        if self._state != "running":  # paused or stopped meanwhile: the caller removes it
            return
        self._registered = True
        self._last_ok = self._clock()
        self.registrations += 1
        self.outage.end()
        self._keep("heartbeat", self._heartbeat)
        if type(self.client).guard is not Registrar.guard:
            self._keep("guard", self._guard)
        if self._follows_overrides():
            self._keep("override", self._follow_override)
        log.debug("%r: registered (ttl %ss, %s every %.3gs)", self, self.ttl, self.kind.words.renewal,
                  self.renew_interval)

    async def _withdraw(self) -> None:
        """Stop renewing and remove the registration (bounded; else the registry drops it after ttl s)."""
        self._cancel_tasks(include_retry=True)
        self._registered = False
        self.outage.end()  # paused or stopped on purpose: not an outage
        try:
            async with self._write_lock():
                await asyncio.wait_for(self.client.deregister(self.instance), REVOKE_TIMEOUT)
        except InstanceGone:
            pass  # gone already (the registry restarted, or dropped it)
        except Exception as e:  # noqa: BLE001 (the control plane must not die)
            words = self.kind.words
            log.warning("%r: %s: %s", self, words.left_behind.format(instance=words.instance, id=self.instance_id,
                                                                     ttl=self.ttl), str(e) or type(e).__name__)

    async def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        await self.client.close()

    def _forget(self, reason: BaseException | None) -> None:
        self._cancel_tasks(include_retry=False)
        was_registered, self._registered = self._registered, False
        if was_registered:
            log.warning("%r: registration lost (%s); registering again", self, reason or "unknown reason")

    async def _update_metadata(self, metadata: dict[str, Any] | None) -> None:
        self.metadata = metadata
        if self._state != "running" or not self._registered:
            return  # the next registration carries it
        try:
            async with self._write_lock():
                await asyncio.wait_for(self.client.register(self.instance), self.timeout)
        except PermissionDenied:
            raise
        except (asyncio.TimeoutError, RegistryError, RegistryUnavailable, OSError) as e:
            raise RegistryUnavailable(f"could not update the metadata of {self.instance_id!r} in {self._where()} "
                                      f"within {self.timeout:g}s: {self._why(e)}") from e
        self._last_ok = self._clock()

    async def _abandon(self) -> None:
        """Undo a start that failed."""
        await self._close()

    def _retryable(self, e: Exception) -> bool:
        """Whether a failed start-up attempt is worth another (the registry not reachable yet)."""
        return isinstance(e, (RegistryUnavailable, asyncio.TimeoutError, OSError))

    def _why(self, e: BaseException) -> str:
        if isinstance(e, asyncio.TimeoutError):
            return "timed out"
        return str(e) or type(e).__name__

    def _checked_metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``metadata`` as it will be registered (a mapping of JSON values, and what the registry carries);
        raises TypeError/ValueError naming what is wrong."""
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping of str keys to JSON values (e.g. {{'weight': 20}}), "
                            f"got {describe_value(metadata)}")
        md = dict(metadata) if metadata else None
        if md:
            check_json(md, "metadata")
        self._check_carried(md)
        return md

    # -- the transitions, on the control loop --------------------------------------------------------

    def _write_lock(self) -> asyncio.Lock:
        """One rewrite of the registration at a time (made on the control loop)."""
        if self._writing is None:
            self._writing = asyncio.Lock()
        return self._writing

    async def _start(self) -> None:
        if self._state in ("running", "paused"):
            return
        self._state = "running"
        try:
            await self._register_within_timeout()
        except BaseException:
            self._state = "new"
            await self._abandon()
            raise
        track(self)

    async def _pause(self) -> None:
        if self._state != "running":
            return
        self._state = "paused"
        log.info("%r: paused, removing the registration", self)
        await self._withdraw()

    async def _resume(self) -> None:
        if self._state != "paused":
            return
        self._state = "running"
        try:
            await self._register_within_timeout()
        except (RegistryUnavailable, PermissionDenied) as e:
            self._recover_later(e)  # running: unregistered against our will from now on, until it works
            raise

    async def _stop(self) -> None:
        if self._state == "stopped":
            return
        was = self._state
        self._state = "stopped"
        untrack(self)
        try:
            if was != "new":
                await self._withdraw()
        finally:
            await self._close()

    # -- registering within the timeout -------------------------------------------------------------

    async def _register_within_timeout(self) -> None:
        """Register, retrying with backoff until ``timeout`` runs out (see the module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        attempts = 0
        cause: BaseException | None = None  # the last failure that said why
        last: BaseException | None = None
        while attempts < MAX_START_ATTEMPTS:
            attempts += 1
            try:
                await self._attempt(deadline - loop.time())
                if attempts > 1:
                    log.info("%r: registered at attempt %d", self, attempts)
                return
            except PermissionDenied:
                raise  # a refusal, not an outage: say so as it is
            except Exception as e:
                if not self._retryable(e):
                    if isinstance(e, RegistryError):  # the registry answered: another attempt gets the same answer
                        raise self._not_registered(e, e, attempts) from e
                    raise
                last = e
                if not isinstance(e, asyncio.TimeoutError):
                    cause = e
            pause = START_BACKOFF.delay(attempts, self._rng)
            if deadline - loop.time() <= pause + MIN_START_ATTEMPT:
                break
            log.debug("%r: registering failed (%s); again in %.2fs", self, last, pause)
            await asyncio.sleep(pause)
        assert last is not None
        raise self._not_registered(last, cause, attempts) from last

    def _not_registered(self, last: BaseException, cause: BaseException | None, attempts: int) -> RegistryUnavailable:
        why = self._why(last)
        if isinstance(last, asyncio.TimeoutError) and cause is not None:
            why += f" (before that: {self._why(cause)})"
        tries = f" ({attempts} attempts)" if attempts > 1 else ""
        return RegistryUnavailable(f"could not register {self.base_key!r}={self.value!r} in {self._where()} "
                                   f"within {self.timeout:g}s{tries}: {why}")

    # -- registering again after a loss ---------------------------------------------------------------

    def _recover_later(self, reason: BaseException | None) -> None:
        """Start registering again (once at a time) after the registration was lost."""
        if self._state != "running":
            return
        if self._retry_task is not None and not self._retry_task.done():
            return
        self._retry_task = spawn(self._recover(reason), name=f"waypost-pub-retry {self.base_key}")

    async def _recover(self, reason: BaseException | None) -> None:
        self._forget(reason)
        if self._state == "running":
            self.outage.begin()
        if await self._register_until_done():
            obs = metrics.current
            if obs is not None:
                obs.lease_reregistered(self.base_key)

    async def _register_until_done(self) -> bool:
        """Register every ~``retry_interval`` s (+-5%) while running, until it works (True) or the publisher
        is paused or stopped (False); a failure is logged once when the state changes, not on every retry."""
        failing = False
        while self._state == "running":
            try:
                await self._attempt(self.timeout)
            except asyncio.CancelledError:
                if self._state != "running":
                    return False
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if not failing:
                    failing = True
                    log.warning("%r: registering failed, retrying every ~%gs until it works: %s", self,
                                self.retry_interval, self._why(e))
                else:
                    log.debug("%r: registering failed again: %s", self, self._why(e))
                await asyncio.sleep(cool_down(self._rng, self.retry_interval))
                continue
            if failing:
                log.warning("%r: registered again after failures", self)
            return True
        return False

    # -- what runs while registered ------------------------------------------------------------------

    def _keep(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``run()`` as the keeper ``name`` unless it runs already (cancelled when the registration goes)."""
        task = self._keepers.get(name)
        if task is None or task.done():
            # they outlive the attempt that starts them: without its etcd deadline
            self._keepers[name] = caller_deadline.detached().run(asyncio.get_running_loop().create_task, run())

    def _cancel_tasks(self, include_retry: bool) -> None:
        current = asyncio.current_task()
        tasks = [*self._keepers.values()] + ([self._retry_task] if include_retry else [])
        for task in tasks:
            if task is not None and task is not current:
                task.cancel()
        self._keepers.clear()
        if include_retry:
            self._retry_task = None

    async def _heartbeat(self) -> None:
        """Renew every ttl/3 s; gone: register again now; other failures: retry ~1 s, lost after ttl s."""
        renewal = self.kind.words.renewal
        failing = False
        while self._state == "running" and self._registered:
            delay = min(self.retry_interval, self.renew_interval) if failing else self.renew_interval
            await asyncio.sleep(cool_down(self._rng, delay))
            if self._state != "running" or not self._registered:
                return
            try:
                await self.client.renew(self.instance)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the control plane must not die)
                if isinstance(e, InstanceGone):
                    log.debug("%r: the registry no longer has the registration (%s)", self, e)
                    self._recover_later(e)
                    return
                overdue = self._clock() - self._last_ok
                if overdue >= self.ttl:
                    self._recover_later(RegistryUnavailable(self.kind.words.lost.format(
                        renewal=renewal, overdue=overdue, ttl=self.ttl, error=str(e) or type(e).__name__)))
                    return
                (log.warning if not failing else log.debug)(
                    "%r: %s failed (retrying; lost only after %ds without one): %s", self, renewal, self.ttl,
                    str(e) or type(e).__name__)
                failing = True
                continue
            self.renewals += 1
            self._last_ok = self._clock()
            if failing:
                log.info("%r: %s works again", self, renewal)
            failing = False

    async def _guard(self) -> None:
        """The registrar's ``guard``: the instance gone or changed from outside is registered again at once."""
        try:
            await self.client.guard(self.instance)
        except InstanceGone as e:
            if self._state == "running" and self._registered:
                log.debug("%r: the registry no longer has the registration as written (%s)", self, e)
                self._recover_later(e)

    # -- following the operator's override --------------------------------------------------------------

    async def _read_override(self, within: float) -> None:
        """The record in force, before the instance is written. The read is part of the attempt: one that fails
        fails it, naming the store's error (the registry that cannot answer it would not take the registration)."""
        store = self._store = self._store or self._open_store()
        if store is None or not hasattr(store, "watch"):
            return
        records = store.watch(override_key(self.base_key, self.value))
        try:
            value = await asyncio.wait_for(anext(records), within)
        finally:
            if hasattr(records, "aclose"):
                await records.aclose()
        self.override = parse_override(value) if value is not None else None

    async def _follow_override(self) -> None:
        """Follow this instance's override record while registered; a change is written at once. A store without
        ``watch`` has nothing to follow; a failure is retried every ~1 s (the registration stays as it is)."""
        store, self._store = self._store or self._open_store(), None
        try:
            if store is None or not hasattr(store, "watch"):
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
            if store is not None:
                await store.close()

    async def _take_override(self, record: dict[str, Any] | None) -> None:
        if record == self.override:
            return
        previous, self.override = self.override, record
        if self._state == "running" and self._registered:
            try:
                async with self._write_lock():
                    await asyncio.wait_for(self.client.register(self.instance), self.timeout)
            except BaseException:
                self.override = previous  # not written: the next look at the record tries again
                raise
        log.info("%r: override %s", self, f"weight {record['weight']}" if record else "removed")
