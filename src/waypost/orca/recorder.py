"""What the application says about its load, after grpc-go's ``orca.ServerMetricsRecorder`` and
``orca.CallMetricsRecorder``.

- ``ServerMetricsRecorder``: one per server, values that hold until changed (``set_*``; ``None`` deletes a value,
  and the measured one is reported again). Values set here replace the measured ones (CPU, memory, requests and
  errors per second) in every report, per call and out of band.
- ``CallMetricsRecorder``: one per call (``waypost.orca.call_recorder(context)`` inside a handler): values for
  this call's trailer only, on top of the server's (``request_cost`` and ``named_metrics`` exist only here).

Validation is grpc-go's: utilizations and rates are finite and >= 0; ``mem_utilization`` is at most 1. A wrong
value raises ValueError at the call that set it, so it never reaches a client.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from contextvars import ContextVar

__all__ = ["CallMetricsRecorder", "ServerMetricsRecorder", "call_recorder"]

_FIELDS = ("cpu_utilization", "mem_utilization", "application_utilization", "rps_fractional", "eps")


def _check(name: str, value: object, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (upper is not None and v > upper):
        bound = f"in [0, {upper:g}]" if upper is not None else "finite and >= 0"
        raise ValueError(f"{name}: must be {bound}, got {value!r}")
    return v


class _Values:
    """The fields and maps both recorders share; a lock guards them (set from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fields: dict[str, float] = {}
        self._utilization: dict[str, float] = {}
        self.version = 0  # bumped on each change: a cached report knows it is stale

    def _set(self, field: str, value: float | None, upper: float | None = None, *, named: bool = False) -> None:
        """Set ``field`` (a named utilization with ``named``) to the checked ``value``; None deletes it."""
        values = self._utilization if named else self._fields
        v = None if value is None else _check(f"utilization[{field!r}]" if named else field, value, upper)
        with self._lock:
            if v is None:
                values.pop(field, None)
            else:
                values[field] = v
            self.version += 1

    def set_cpu_utilization(self, value: float | None) -> None:
        """CPU utilization (>= 0; may exceed 1 on a server using more than its share); None: measured again."""
        self._set("cpu_utilization", value)

    def set_mem_utilization(self, value: float | None) -> None:
        """Memory utilization in [0, 1]; None: measured again."""
        self._set("mem_utilization", value, 1.0)

    def set_application_utilization(self, value: float | None) -> None:
        """The application's own utilization (>= 0); weighted_round_robin prefers it to CPU."""
        self._set("application_utilization", value)

    def set_qps(self, value: float | None) -> None:
        """Requests per second (``rps_fractional``); None: the server's measured rate again."""
        self._set("rps_fractional", value)

    def set_eps(self, value: float | None) -> None:
        """Errors per second; None: the server's measured rate again."""
        self._set("eps", value)

    def set_named_utilization(self, name: str, value: float | None) -> None:
        """``utilization[name]`` in [0, 1]; None deletes it."""
        self._set(str(name), value, 1.0, named=True)

    def values(self) -> tuple[dict[str, float], dict[str, float]]:
        """A copy of (fields, named utilizations)."""
        with self._lock:
            return dict(self._fields), dict(self._utilization)


class ServerMetricsRecorder(_Values):
    """Server-wide values carried by every ORCA report of one server (see the module doc)."""


class CallMetricsRecorder(_Values):
    """Values for one call's ORCA trailer (see the module doc); get it with ``call_recorder(context)``."""

    def __init__(self) -> None:
        super().__init__()
        self._cost: dict[str, float] = {}
        self._named: dict[str, float] = {}

    def set_request_cost(self, name: str, value: float) -> None:
        """``request_cost[name]``: what this call cost (any finite number >= 0: units are the application's)."""
        with self._lock:
            self._cost[str(name)] = _check(f"request_cost[{name!r}]", value)

    def set_named_metric(self, name: str, value: float) -> None:
        """``named_metrics[name]``: any finite number."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"named_metrics[{name!r}]: must be a finite number, got {value!r}")
        with self._lock:
            self._named[str(name)] = float(value)

    def costs(self) -> tuple[Mapping[str, float], Mapping[str, float]]:
        """A copy of (request_cost, named_metrics)."""
        with self._lock:
            return dict(self._cost), dict(self._named)


class CallSlot:
    """The current call's place for its recorder (the recorder is made only when the handler asks for one); the
    ORCA interceptor sets ``current_slot`` to it while the call's handler runs."""

    __slots__ = ("recorder",)

    def __init__(self) -> None:
        self.recorder: CallMetricsRecorder | None = None


current_slot: ContextVar[CallSlot | None] = ContextVar("waypost_orca_call", default=None)


def call_recorder(context: object = None) -> CallMetricsRecorder:
    """The ORCA recorder of the call being handled (inside a handler of a server with waypost's ORCA
    interceptor: ``waypost.serve`` adds it to a ``grpc.server``; pass ``waypost.orca.interceptor(aio=True)`` to
    a ``grpc.aio.server``). ``context`` is the handler's context (accepted for symmetry with grpc-go's
    ``CallMetricsRecorderFromContext``; the call is found from the running handler).

    Raises RuntimeError outside such a handler: values set there would reach no trailer.
    """
    slot = current_slot.get()
    if slot is None:
        raise RuntimeError("waypost.orca.call_recorder: not inside a call handled by waypost's ORCA interceptor "
                           "(waypost.serve() adds it; grpc.aio.server needs "
                           "interceptors=[waypost.orca.interceptor(aio=True)])")
    if slot.recorder is None:
        slot.recorder = CallMetricsRecorder()
    return slot.recorder
