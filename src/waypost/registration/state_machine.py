"""The life of a registration in one registry (etcd, memory, Consul, ZooKeeper, Eureka), written once: the
start / pause / resume / stop transitions and their idempotence, registering within ``timeout`` with retries,
and registering again, forever, once the registration is lost. ``KindRegistration`` (every kind) supplies the hooks:

- ``_register()``: one attempt that leaves nothing behind when it fails (``_attempt(left)`` bounds it; a
  publisher may add to the bounding, e.g. etcd's per-call deadline or ZooKeeper's connection);
- ``_withdraw()``: stop keeping the registration alive and remove it (pause, stop); ``_close()``: free the
  connection at stop; ``_abandon()``: undo a start that failed;
- ``_forget(reason)``: drop a lost registration before registering again;
- ``_update_metadata(md)``, ``_check_carried(md)`` (what the registry cannot carry), ``_where()`` (for messages) and, where the defaults do
  not fit, ``_retryable(e)``, ``_why(e)`` and ``_recover_later(reason)``.

Registering at start or resume: retried with backoff (``FIRST_RETRY`` s doubling to ``MAX_RETRY`` s, jittered)
until ``timeout`` runs out, so a registry that starts a little after this server (docker compose and Kubernetes
start them together) is waited for. A refusal (``PermissionDenied``) or an answer that another attempt would get
again (``RegistryError``) raises at once; when the time is up, ``RegistryUnavailable`` names the last cause. A
resume that fails goes on in the background (``_recover_later``).

The public face (blocking methods, ``a*`` twins, context managers) is ``RegistrationFaces``'.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import random
from collections.abc import Coroutine, Mapping
from typing import Any

from .. import metrics
from ..backoff import Backoff, cool_down
from ..errors import PermissionDenied, RegistryError, RegistryUnavailable, describe_value
from ..etcd import deadline as caller_deadline
from .contract import RegistrationFaces, on_control_loop
from .outage import track, untrack

__all__ = ["REVOKE_TIMEOUT", "PublisherBase", "check_json", "on_control_loop", "spawn"]

log = logging.getLogger("waypost.discovery")

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


class PublisherBase(RegistrationFaces):
    """One registration in one registry (see the module docstring); subclasses set ``base_key``, ``value``,
    ``timeout``, ``retry_interval``, ``outage`` and ``_rng``."""

    base_key: str
    value: str
    metadata: Any
    retry_interval: float
    _rng: random.Random
    _retry_task: asyncio.Task[None] | None = None
    _writing: asyncio.Lock | None = None
    _extra_wait = REVOKE_TIMEOUT + 10

    # -- hooks -------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _register(self) -> None:
        """One registration attempt; leaves nothing behind when it fails (``_attempt`` bounds it)."""

    async def _attempt(self, left: float) -> None:
        """One attempt, bounded by ``left`` seconds."""
        await asyncio.wait_for(self._register(), left)

    @abc.abstractmethod
    async def _withdraw(self) -> None:
        """Stop keeping the registration alive and remove it (bounded: a registry that does not answer
        lets it expire)."""

    async def _close(self) -> None:
        """Free what the publisher holds open (at stop, after ``_withdraw``)."""

    async def _abandon(self) -> None:
        """Undo a start that failed."""
        await self._close()

    def _forget(self, reason: BaseException | None) -> None:
        """Drop a lost registration before registering again."""
        self._registered = False

    @abc.abstractmethod
    def _where(self) -> str:
        """The registry, for messages (no secrets)."""

    def _retryable(self, e: Exception) -> bool:
        """Whether a failed start-up attempt is worth another (the registry not reachable yet)."""
        return isinstance(e, (RegistryUnavailable, asyncio.TimeoutError, OSError))

    def _why(self, e: BaseException) -> str:
        if isinstance(e, asyncio.TimeoutError):
            return "timed out"
        return str(e) or type(e).__name__

    def _check_carried(self, metadata: dict[str, Any] | None) -> None:
        """Raise TypeError/ValueError, naming what is wrong, if this registry cannot carry ``metadata``."""

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
