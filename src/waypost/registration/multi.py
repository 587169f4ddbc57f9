"""``MultiPublisher``: one registration in several registries at once.

``MultiPublisher`` (the usual advice for a registry outage: two registries backing each other up): the instance is
registered in each registry; one that cannot be reached does not stop the others. ``start()`` returns once every
registry has answered (or ``START_GRACE`` s after the first registered) and fails fast only when no registry could
be reached; the ones that failed are retried in the
background (every ``retry_interval`` s) until they register, and each member keeps its own registration alive
and restores it as it always does. The outage clock (``max_unregistered``) runs while the instance is
registered nowhere. ``members`` and ``status()`` say where it is registered now; each member reports its own
metrics (``waypost_publisher_*``, labelled by its registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from ..errors import RegistryUnavailable, suggests_keywords
from .contract import Registration, RegistrationFaces
from .outage import OnUnregistered, Outage, registry_label

log = logging.getLogger("waypost.discovery")

#: seconds between registration attempts in a registry that could not be reached at start
RETRY_INTERVAL = 1.0
#: once one registry has the registration, how much longer start() waits for the others (healthy registries
#: answer well within it; an unreachable one is left to the background retries instead of delaying start-up)
START_GRACE = 1.0
#: how often the registered-anywhere state is sampled for the outage clock
OUTAGE_POLL = 0.25


def _where(member: Registration) -> str:
    return registry_label(member) or type(member).__name__


class MultiPublisher(RegistrationFaces):
    """One registration in each of several registries (see the module docstring)."""

    #: a member's stop may take its own timeout plus its teardown bounds
    _extra_wait = 30.0

    @suggests_keywords("waypost.MultiPublisher")
    def __init__(self, members: Sequence[Registration], *, timeout: float = 5.0,
                 retry_interval: float = RETRY_INTERVAL, max_unregistered: float | None = None, on_unregistered: OnUnregistered = None) -> None:
        if len(members) < 1:
            raise ValueError("MultiPublisher needs at least one member")
        self.members = list(members)
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.outage = Outage(self, max_unregistered, on_unregistered)
        self._tasks: list[asyncio.Task[None]] = []

    # -- what serve() and users read ----------------------------------------------------------------

    @property
    def registered(self) -> bool:
        """Registered in at least one registry."""
        return any(m.registered for m in self.members)

    @property
    def key(self) -> str | None:
        """The first member's registration key that is registered now (None: registered nowhere)."""
        return next((m.key for m in self.members if m.registered), None)

    @property
    def keys(self) -> list[str | None]:
        """Each member's registration key now (None where not registered), in the order given."""
        return [m.key for m in self.members]

    @property
    def lease_id(self) -> None:
        return None

    @property
    def registrations(self) -> int:
        return sum(getattr(m, "registrations", 0) for m in self.members)

    def status(self) -> dict[str, bool]:
        """Registered or not, by registry."""
        return {_where(m): bool(m.registered) for m in self.members}

    def __repr__(self) -> str:
        return f"<MultiPublisher {self._state} {self.status()}>"

    # -- what the faces run, on the control loop ----------------------------------------------------

    def _checked_metadata(self, metadata: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """Refuse (TypeError/ValueError) metadata any registry cannot carry (Consul limits keys and value
        lengths, for one), before any registry is written: it is written to all of them or to none, so they
        never disagree."""
        for m in self.members:
            m.check_metadata(metadata)
        return metadata

    async def _stop(self) -> None:
        await self._each("astop", self._stopping())

    async def _pause(self) -> None:
        await self._each("apause", self._pausing())

    async def _start(self) -> None:
        await self._register_all(resume=False)

    async def _resume(self) -> None:
        await self._register_all(resume=True)

    async def _update_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        await self._each("aupdate_metadata", None, metadata)

    # -- on the control loop ------------------------------------------------------------------------

    async def _register_all(self, resume: bool) -> None:
        """Register in every member at once; return once each has answered, or ``START_GRACE`` s after the first
        one registered (the others go on in the background, retried until they register); RegistryUnavailable
        when none could."""
        if self._state == "running" or (resume and self._state != "paused") or self._state == "stopped":
            return
        self._state = "running"
        method = "aresume" if resume else "astart"
        loop = asyncio.get_running_loop()
        attempts = {loop.create_task(getattr(m, method)()): i for i, m in enumerate(self.members)}
        pending = set(attempts)
        errors: dict[int, BaseException] = {}
        registered = False
        grace_until: float | None = None
        while pending:
            wait = None if grace_until is None else max(0.0, grace_until - loop.time())
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break  # the grace is over: the rest go on in the background
            for t in done:
                if t.exception() is None:
                    registered = True
                else:
                    errors[attempts[t]] = t.exception()  # type: ignore[assignment]
            if registered and grace_until is None:
                grace_until = loop.time() + START_GRACE
        if not registered:
            self._state = "paused" if resume else "new"
            why = "; ".join(f"{_where(self.members[i])}: {e}" for i, e in sorted(errors.items()))
            raise RegistryUnavailable(f"could not register in any of {len(self.members)} registries: {why}")
        for i, e in sorted(errors.items()):
            self._tasks.append(loop.create_task(self._retry(i, method, e)))
        for t in pending:  # still trying: wait for them in the background
            self._tasks.append(loop.create_task(self._settle(attempts[t], t, method)))
        self._tasks.append(loop.create_task(self._watch_outage()))

    async def _settle(self, i: int, attempt: asyncio.Task[Any], method: str) -> None:
        try:
            await attempt
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        except Exception as e:  # noqa: BLE001
            await self._retry(i, method, e)

    async def _retry(self, i: int, method: str, first: BaseException) -> None:
        member = self.members[i]
        log.warning("waypost: registering in %s failed (%s); the other registries have it, retrying every %gs",
                    _where(member), first, self.retry_interval)
        while self._state == "running":
            await asyncio.sleep(self.retry_interval)
            try:
                await getattr(member, method)()
            except Exception as e:  # noqa: BLE001  # still unreachable: try again
                log.debug("waypost: registering in %s: %s", _where(member), e)
                continue
            log.info("waypost: registered in %s too", _where(member))
            return

    async def _watch_outage(self) -> None:
        while self._state == "running":
            if self.registered:
                self.outage.end()
            else:
                self.outage.begin()
            await asyncio.sleep(OUTAGE_POLL)

    async def _stopping(self) -> None:
        self._state = "stopped"

    async def _pausing(self) -> None:
        if self._state == "running":
            self._state = "paused"

    async def _each(self, method: str, before: Awaitable[None] | None, *args: Any) -> None:
        if before is not None:
            await before
            tasks, self._tasks = self._tasks, []
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self.outage.end()  # on purpose: not an outage
        results = await asyncio.gather(*(getattr(m, method)(*args) for m in self.members), return_exceptions=True)
        errors = [(m, r) for m, r in zip(self.members, results) if isinstance(r, BaseException)]
        for m, e in errors:
            log.warning("waypost: %s in %s failed: %s", method.lstrip("a"), _where(m), e)
        if errors and len(errors) == len(self.members) and method == "aupdate_metadata":
            raise RegistryUnavailable(f"updating the metadata failed in every registry: {errors[0][1]}")
