"""Which registration a registry gets, and registering in several registries at once.

``make_publisher(registry, key, address, ...)`` is what ``serve()`` uses:

- an etcd or memory registry (a URL or a ``waypost.connect`` result) -> ``Publisher`` (a key under a lease);
- ``consul://...`` -> ``ConsulPublisher`` (a service instance in Consul's catalog, with a TTL check);
- ``zk://...`` -> ``ZkPublisher`` (an ephemeral node in Kratos' layout);
- a list of them -> ``MultiPublisher`` over one of each;
- None -> ``NoRegistration``: nothing is written anywhere (inside Kubernetes: the readiness probe decides).

Every one has the same interface (start / stop / pause / resume / update_metadata / check_metadata, their ``a*`` twins, ``key``,
``registered``, ``outage``), so ``serve()``'s lifecycle is the same whatever the registry.

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
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _loop
from ..errors import RegistryUnavailable
from .outage import OnUnregistered, Outage, registry_label
from .publisher_base import on_control_loop

log = logging.getLogger("waypost.discovery")

#: seconds between registration attempts in a registry that could not be reached at start
RETRY_INTERVAL = 1.0
#: once one registry has the registration, how much longer start() waits for the others (healthy registries
#: answer well within it; an unreachable one is left to the background retries instead of delaying start-up)
START_GRACE = 1.0
#: how often the registered-anywhere state is sampled for the outage clock
OUTAGE_POLL = 0.25


def registry_scheme(registry: Any) -> str:
    """``consul``, ``zk`` or ``etcd`` (also memory and Registry objects: the key-value registries)."""
    if isinstance(registry, str):
        scheme = registry.partition("://")[0].lower()
        if scheme in ("consul", "zk"):
            return scheme
    return "etcd"


def connect_registries(registry: Any) -> Any:
    """What a publisher is made with: etcd URLs connected (``waypost.connect``: one shared connection per
    cluster), lists member by member, Consul and ZooKeeper URLs as they are (their publishers connect)."""
    if registry is None:
        return None
    if isinstance(registry, list | tuple):
        return [connect_registries(r) for r in registry]
    if isinstance(registry, str) and registry_scheme(registry) == "etcd":
        from ..registry import connect

        return connect(registry)
    return registry


def make_publisher(registry: Any, key: str, address: str, **kw: Any) -> Any:
    """The publisher for ``registry`` (a URL, a Registry, a list of them, or None: see the module docstring)."""
    if registry is None:
        return NoRegistration()
    if isinstance(registry, list | tuple):
        if not registry:
            raise ValueError("serve: registry=[] names no registry; give one or more URLs, or None for none")
        alerts = {k: kw.pop(k) for k in ("max_unregistered", "on_unregistered") if k in kw}
        members = [make_publisher(r, key, address, **kw) for r in registry]
        return MultiPublisher(members, timeout=kw.get("timeout", 5.0), **alerts)
    scheme = registry_scheme(registry)
    if scheme == "consul":
        from .consul_publisher import ConsulPublisher

        return ConsulPublisher(registry, key, address, **kw)
    if scheme == "zk":
        from .zk_publisher import ZkPublisher

        return ZkPublisher(registry, key, address, **kw)
    from .publisher import Publisher

    return Publisher(registry, key, address, **kw)


def _where(member: Any) -> str:
    return registry_label(member) or type(member).__name__


class MultiPublisher:
    """One registration in each of several registries (see the module docstring)."""

    def __init__(self, members: Sequence[Any], *, timeout: float = 5.0, retry_interval: float = RETRY_INTERVAL,
                 max_unregistered: float | None = None, on_unregistered: OnUnregistered = None) -> None:
        if len(members) < 1:
            raise ValueError("MultiPublisher needs at least one member")
        self.members = list(members)
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.outage = Outage(self, max_unregistered, on_unregistered)
        self._state = "new"
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

    # -- sync API and async twins -------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        if _loop.in_loop():
            raise RuntimeError("MultiPublisher methods block: on the control loop await the a*() twins instead")
        return _loop.run(coro, self.timeout + 30)

    def start(self) -> MultiPublisher:
        self._run(self._start())
        return self

    def stop(self) -> None:
        self._run(self._each("astop", self._stopping()))

    def pause(self) -> None:
        self._run(self._each("apause", self._pausing()))

    def resume(self) -> None:
        self._run(self._start(resume=True))

    def check_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        """Raise TypeError/ValueError if any registry cannot carry ``metadata`` (Consul limits keys and value
        lengths, for one): it is written to all of them or to none, so they never disagree."""
        for m in self.members:
            m.check_metadata(metadata)

    def update_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        self.check_metadata(metadata)  # before any registry is written: the same refusal as at serve()
        self._run(self._each("aupdate_metadata", None, metadata))

    async def astart(self) -> MultiPublisher:
        await on_control_loop(self._start())
        return self

    async def astop(self) -> None:
        await on_control_loop(self._each("astop", self._stopping()))

    async def apause(self) -> None:
        await on_control_loop(self._each("apause", self._pausing()))

    async def aresume(self) -> None:
        await on_control_loop(self._start(resume=True))

    async def aupdate_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        self.check_metadata(metadata)
        await on_control_loop(self._each("aupdate_metadata", None, metadata))

    def __enter__(self) -> MultiPublisher:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- on the control loop ------------------------------------------------------------------------

    async def _start(self, resume: bool = False) -> None:
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

    async def _each(self, method: str, before: Any, *args: Any) -> None:
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


class NoRegistration:
    """The registration of ``serve(..., registry=None)``: nothing is written anywhere. Inside Kubernetes the
    readiness probe (the health service, which pause/resume and the graceful stop still drive) decides whether
    the pod is in its Service's EndpointSlices."""

    key = None
    registered = False
    lease_id = None

    def __init__(self) -> None:
        self.outage = Outage(self, None, None)  # never lost: nothing to lose

    def start(self) -> None:
        pass

    stop = pause = resume = start

    def check_metadata(self, metadata: Any) -> None:
        pass  # nothing is written: any metadata is as good as none

    def update_metadata(self, metadata: Any) -> None:
        pass

    async def astart(self) -> None:
        pass

    astop = apause = aresume = astart

    async def aupdate_metadata(self, metadata: Any) -> None:
        pass
