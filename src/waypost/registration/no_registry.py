"""``NoRegistration``: the registration of ``serve(..., registry=None)``, which writes nothing anywhere."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from .contract import RegistrationFaces
from .outage import Outage

T = TypeVar("T")


class NoRegistration(RegistrationFaces):
    """Nothing is written anywhere. Inside Kubernetes the readiness probe (the health service, which
    pause/resume and the graceful stop still drive) decides whether the pod is in its Service's EndpointSlices.
    Its transitions only change ``state``; they never wait for anything, so they run in the caller's thread or
    event loop and never start the control loop."""

    timeout = 0.0
    lease_id = None

    def __init__(self) -> None:
        self.outage = Outage(self, None, None)  # never lost: nothing to lose

    @property
    def key(self) -> None:
        return None

    def _run(self, coro: Awaitable[T]) -> T:
        # the coroutines below never suspend: run one to its end here
        steps = coro.__await__()
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        raise RuntimeError("a NoRegistration transition suspended")  # pragma: no cover

    async def _await(self, coro: Awaitable[T]) -> T:
        return await coro

    async def _start(self) -> None:
        if self._state not in ("running", "paused"):
            self._state = "running"

    async def _pause(self) -> None:
        if self._state == "running":
            self._state = "paused"

    async def _resume(self) -> None:
        if self._state == "paused":
            self._state = "running"

    async def _stop(self) -> None:
        self._state = "stopped"

    def _checked_metadata(self, metadata: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return metadata  # nothing is written: any metadata is as good as none

    async def _update_metadata(self, metadata: Any) -> None:
        pass
