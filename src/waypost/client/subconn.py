"""One backend address: its own grpc channel, connectivity state, health and in-flight count."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..types import CONNECTING, IDLE, READY, STATE_NAMES, TRANSIENT_FAILURE, Backend

if TYPE_CHECKING:
    import grpc
    import grpc.aio


class SubConn:
    """A backend and the real grpc channel (sync or aio) talking to it.

    ``failing`` is gRPC's sticky TRANSIENT_FAILURE: set when a connection attempt fails or an established
    connection is lost, cleared only when the channel is READY again. A subconn that never connected and is
    not failing counts as "still connecting" (calls wait for it instead of failing).
    """

    __slots__ = (
        "__weakref__",
        "address",
        "backend",
        "channel",
        "failing",
        "health_task",
        "healthy",
        "inflight",
        "mcs",
        "probe",
        "removed",
        "removed_at",
        "state",
    )

    def __init__(self, backend: Backend, channel: grpc.Channel | grpc.aio.Channel, *, health: bool) -> None:
        self.address = backend.address
        self.backend = backend
        self.channel = channel
        self.state = IDLE
        self.failing = False
        # None: health unknown yet (treated as still connecting); True/False after the first Watch answer.
        self.healthy: bool | None = None if health else True
        # Updated with += / -= from caller threads. In CPython an attribute add on an int is not interrupted by
        # a thread switch (no eval-breaker check inside it); the drain timeout bounds any drift anyway.
        self.inflight = 0
        self.mcs: dict[Any, Any] = {}  # (kind, method, ser, deser) -> the backend channel's multicallable
        self.removed = False
        self.removed_at = 0.0
        self.health_task: object = None  # what start_health returned, for stop_health
        self.probe: Any = None  # f(try_to_connect) -> connectivity int, set by the SubConnPool

    @property
    def usable(self) -> bool:
        return self.state == READY and self.healthy is True and not self.removed

    @property
    def connecting(self) -> bool:
        """Not usable yet but expected to become so soon (fresh connection or pending first health answer)."""
        if self.removed or self.failing or self.healthy is False:
            return False
        if self.state in (IDLE, CONNECTING):
            return True
        return self.state == READY and self.healthy is None

    def describe(self) -> str:
        s = STATE_NAMES[self.state] if 0 <= self.state < len(STATE_NAMES) else str(self.state)
        if self.failing and self.state != TRANSIENT_FAILURE:
            s = f"{s} (after failure)"
        if self.healthy is False:
            s = f"{s}, health NOT_SERVING"
        elif self.state == READY and self.healthy is None:
            s = "READY, health pending"
        return f"{self.address}={s}"
