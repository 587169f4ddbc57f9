"""What every publisher (etcd, Consul, ZooKeeper) shares: the blocking methods, their ``a*`` twins, the
context managers and the state properties, all over five coroutines a publisher implements on the control loop
(``_start``, ``_pause``, ``_resume``, ``_stop``, ``_update_metadata``) plus ``_checked_metadata``.

The sync methods block the calling thread until the work is done on the control loop (never call them from
it); the ``a*`` twins await it from any event loop (e.g. a ``grpc.aio`` server's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from typing_extensions import Self

from .. import _loop
from .outage import Outage

T = TypeVar("T")
P = TypeVar("P", bound="PublisherBase")

#: bound on a deregistration at pause/stop (after it, the TTL / session expiry cleans up)
REVOKE_TIMEOUT = 2.0


async def on_control_loop(coro: Awaitable[T]) -> T:
    """Await ``coro`` on the control loop from any event loop."""
    if _loop.in_loop():
        return await coro
    return await asyncio.wrap_future(_loop.submit(coro))


class PublisherBase:
    """The public face of a publisher; subclasses set ``timeout``, ``outage``, ``_state`` ("new", "running",
    "paused", "stopped"), ``_registered`` and ``_writing`` (None) and implement the coroutines above."""

    timeout: float
    outage: Outage
    _state: str
    _registered: bool
    _writing: asyncio.Lock | None
    #: how much longer than ``timeout`` a blocking call may wait (teardown bounds)
    _extra_wait: float = REVOKE_TIMEOUT + 10

    # -- implemented by each publisher, on the control loop ---------------------------------------------

    async def _start(self) -> None:
        raise NotImplementedError

    async def _pause(self) -> None:
        raise NotImplementedError

    async def _resume(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    async def _update_metadata(self, metadata: Any) -> None:
        raise NotImplementedError

    def _checked_metadata(self, metadata: Mapping[str, Any] | None) -> Any:
        raise NotImplementedError

    def check_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        """Raise TypeError/ValueError, naming what is wrong, if this registration cannot carry ``metadata``
        (what the constructor and ``update_metadata`` refuse); write nothing."""
        self._checked_metadata(metadata)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def unregistered_seconds(self) -> float:
        """How long the registration has been lost against our will (0 while registered or paused)."""
        return self.outage.seconds()

    @property
    def state(self) -> str:
        """``new``, ``running``, ``paused`` or ``stopped``."""
        return self._state

    def _write_lock(self) -> asyncio.Lock:
        """One rewrite of the registration at a time (made on the control loop)."""
        if self._writing is None:
            self._writing = asyncio.Lock()
        return self._writing

    # -- sync API ------------------------------------------------------------------------------------

    def _run(self, coro: Awaitable[T]) -> T:
        if _loop.in_loop():
            raise RuntimeError(f"{type(self).__name__} methods block: on the control loop await the a*() twins "
                               "instead")
        return _loop.run(coro, self.timeout + self._extra_wait)

    def start(self) -> Self:
        """Register and keep the registration alive; RegistryUnavailable if not done within timeout."""
        self._run(self._start())
        return self

    def pause(self) -> None:
        """Remove the registration (it disappears at once, traffic drains) until resume()."""
        self._run(self._pause())

    def resume(self) -> None:
        """Register again after pause(); if that fails within timeout, raise RegistryUnavailable and keep
        retrying in the background."""
        self._run(self._resume())

    def stop(self) -> None:
        """Stop keeping the registration alive and remove it. Idempotent."""
        self._run(self._stop())

    def update_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        """Replace the registration's metadata (e.g. ``{"weight": 5}``) in place: subscribers see one change.
        Validated as the constructor does. Not registered now (paused, lost, not started): the next
        registration carries it. RegistryUnavailable if the write fails within ``timeout`` (the new metadata
        is kept and used from then on)."""
        self._run(self._update_metadata(self._checked_metadata(metadata)))

    # -- async twins ---------------------------------------------------------------------------------

    async def astart(self) -> Self:
        await on_control_loop(self._start())
        return self

    async def apause(self) -> None:
        await on_control_loop(self._pause())

    async def aresume(self) -> None:
        await on_control_loop(self._resume())

    async def astop(self) -> None:
        await on_control_loop(self._stop())

    async def aupdate_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        await on_control_loop(self._update_metadata(self._checked_metadata(metadata)))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
