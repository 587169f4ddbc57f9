"""Where the call path meets OpenTelemetry: the module attribute ``current`` the client reads (None while
``waypost.otel`` is off, so a disabled hook costs one attribute load and a compare), and the value types the
client passes around. Imports nothing of OpenTelemetry: the client imports this module on every dial.

The client calls three things, in ``client/method.py`` and the multicallables:

- ``current.blocking_call(...)`` / ``current.started_call(...)``: a call's scope (its span, its duration);
- ``current.attempt_begun(...)`` in ``MethodBase.begin``: an attempt's span and the trace context it sends; its
  start time comes back as an ``AttemptStart``, a float that carries the attempt along to ``MethodBase.finish``,
  where ``AttemptStart.ended`` closes it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc

T = TypeVar("T")


class AttemptEnd(Protocol):
    """What ends an attempt: ``ended(code, latency, call)`` (``call``: the finished call or its error, or None)."""

    def ended(self, code: grpc.StatusCode, latency: float, call: Any) -> None: ...


class AttemptStart(float):
    """The start time (``time.perf_counter``) of an attempt ``waypost.otel`` follows: still the float that
    ``MethodBase.finish`` subtracts, plus the attempt's end hook. A float subclass so that the attempt tuples of
    every call kind carry it unchanged."""

    __slots__ = ("end",)
    end: AttemptEnd

    def __new__(cls, t0: float, end: AttemptEnd) -> AttemptStart:  # noqa: PYI034
        self = super().__new__(cls, t0)
        self.end = end
        return self


class ClientTelemetry(Protocol):
    """The client hooks of ``waypost.otel`` (``waypost.otel.client.Telemetry``)."""

    def blocking_call(self, method: str, balancer: Any, run: Callable[[], T]) -> T: ...

    def started_call(self, method: str, balancer: Any, start: Callable[[], T]) -> T: ...

    def attempt_begun(self, method: str, balancer: Any, address: str, mc: Any, t0: float, hedged: bool
                      ) -> tuple[AttemptStart, Any]: ...


#: the enabled client hooks, or None (``waypost.otel.enable`` sets them)
current: ClientTelemetry | None = None

#: the call whose attempts are starting in this context (set by the call hooks around a call's start)
CALL: contextvars.ContextVar[Any] = contextvars.ContextVar("waypost_otel_call", default=None)
