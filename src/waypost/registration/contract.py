"""The registration contract: what ``serve()`` drives, whatever the registry (etcd, memory, Consul, ZooKeeper,
several of them, or none), and the faces every registration shares.

``Registration`` is the declared, typed contract. ``RegistrationFaces`` builds its public face (the blocking
methods, their ``a*`` twins, the context managers and the state properties) over five coroutines a registration
implements on the control loop (``_start``, ``_pause``, ``_resume``, ``_stop``, ``_update_metadata``) plus
``_checked_metadata``. The sync methods block the calling thread until the work is done on the control loop (never
call them from it); the ``a*`` twins await it from any event loop (e.g. a ``grpc.aio`` server's).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from typing_extensions import Self

from .. import _loop
from .outage import Outage

T = TypeVar("T")

#: the life of a registration: new -> running <-> paused -> stopped (a stopped one may be started again)
State = Literal["new", "running", "paused", "stopped"]


@runtime_checkable
class Registration(Protocol):
    """One service instance's registration in zero, one or several registries (what ``serve()`` drives)."""

    @property
    def key(self) -> str | None:
        """Where the registration is now (a registry key, an instance ID, a node path); None while not
        registered."""

    @property
    def registered(self) -> bool:
        """Registered now."""

    @property
    def state(self) -> State:
        """``new``, ``running``, ``paused`` or ``stopped``."""

    @property
    def unregistered_seconds(self) -> float:
        """How long the registration has been lost against our will (0 while registered or paused)."""

    #: the outage clock and the alert after ``max_unregistered`` (``waypost.registration.outage``)
    outage: Outage

    def start(self) -> Self: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...
    def check_metadata(self, metadata: Mapping[str, Any] | None) -> None: ...
    def update_metadata(self, metadata: Mapping[str, Any] | None) -> None: ...
    async def astart(self) -> Self: ...
    async def apause(self) -> None: ...
    async def aresume(self) -> None: ...
    async def astop(self) -> None: ...
    async def aupdate_metadata(self, metadata: Mapping[str, Any] | None) -> None: ...


async def on_control_loop(coro: Awaitable[T]) -> T:
    """Await ``coro`` on the control loop from any event loop."""
    if _loop.in_loop():
        return await coro
    return await asyncio.wrap_future(_loop.submit(coro))


class RegistrationFaces(abc.ABC):
    """The public face of a registration; subclasses set ``timeout``, ``outage``, ``_state``, ``_registered``
    and implement the coroutines named in the module docstring."""

    timeout: float
    outage: Outage
    _state: State = "new"
    _registered: bool = False
    #: how much longer than ``timeout`` a blocking call may wait (teardown bounds)
    _extra_wait: float = 12.0

    # -- implemented by each registration, on the control loop ---------------------------------------

    @abc.abstractmethod
    async def _start(self) -> None:
        """Start: register within the timeout."""

    @abc.abstractmethod
    async def _pause(self) -> None:
        """Pause: remove the registration (traffic drains)."""

    @abc.abstractmethod
    async def _resume(self) -> None:
        """Resume: register again."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Stop for good: remove the registration, free what it holds."""

    @abc.abstractmethod
    async def _update_metadata(self, metadata: Any) -> None:
        """Register ``metadata`` (checked) in place of the current metadata."""

    @abc.abstractmethod
    def _checked_metadata(self, metadata: Mapping[str, Any] | None) -> Any:
        """``metadata`` as it will be registered; TypeError/ValueError naming what is wrong."""

    def check_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        """Raise TypeError/ValueError, naming what is wrong, if this registration cannot carry ``metadata``
        (what the constructor and ``update_metadata`` refuse); write nothing."""
        self._checked_metadata(metadata)

    # -- state ---------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def key(self) -> str | None:
        """The registration's name in the registry now (None while not registered)."""

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def unregistered_seconds(self) -> float:
        """How long the registration has been lost against our will (0 while registered or paused)."""
        return self.outage.seconds()

    @property
    def state(self) -> State:
        """``new``, ``running``, ``paused`` or ``stopped``."""
        return self._state

    # -- where the work runs ----------------------------------------------------------------------------

    def _run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the control loop, blocking this thread until it is done."""
        if _loop.in_loop():
            raise RuntimeError(f"{type(self).__name__} methods block: on the control loop await the a*() twins "
                               "instead")
        return _loop.run(coro, self.timeout + self._extra_wait)

    async def _await(self, coro: Awaitable[T]) -> T:
        """Await ``coro`` on the control loop from any event loop."""
        return await on_control_loop(coro)

    # -- sync API ------------------------------------------------------------------------------------

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
        await self._await(self._start())
        return self

    async def apause(self) -> None:
        await self._await(self._pause())

    async def aresume(self) -> None:
        await self._await(self._resume())

    async def astop(self) -> None:
        await self._await(self._stop())

    async def aupdate_metadata(self, metadata: Mapping[str, Any] | None) -> None:
        await self._await(self._update_metadata(self._checked_metadata(metadata)))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
