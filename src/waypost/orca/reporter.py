"""One server's ORCA reports (``xds.data.orca.v3.OrcaLoadReport``), built from what it measures and what the
application recorded.

Measured (each replaced by the ``ServerMetricsRecorder``'s value when the application set one):

- ``cpu_utilization``: the process's CPU time per wall-clock second over the cores it may run on, between
  readings at least ``CPU_INTERVAL`` (0.5 s) apart (``account.CpuMeter``, as in ``waypost.load.v1``);
- ``mem_utilization``: resident memory over physical memory (Linux ``/proc/self/statm``; absent elsewhere);
- ``rps_fractional`` and ``eps``: calls completed and calls failed per second over the last ``RATE_INTERVAL``
  (1 s) window, from the server's ``LoadAccount``. Without a rate, gRPC's weighted_round_robin cannot weigh a
  backend (its weight is ``qps / utilization``), so a server that accounts its calls always reports it;
- ``application_utilization``: the recorder's, else the ``waypost.set_load`` value when one is set.

``trailer()`` returns the serialized server report, rebuilt at most every ``CACHE_SECONDS`` (or when the
recorder changed): a call pays a clock read and a comparison. A call whose handler used its
``CallMetricsRecorder`` gets a report of its own (the server's values, the call's on top).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ._protos import protos
from .account import CpuMeter, LoadAccount, application_value
from .recorder import CallMetricsRecorder, ServerMetricsRecorder

RATE_INTERVAL = 1.0  # seconds: the window of rps_fractional and eps
CACHE_SECONDS = 0.1  # seconds: how long one serialized server report serves the trailers
TRAILER_KEY = "endpoint-load-metrics-bin"
#: the same report under waypost's key: grpcio (C-core) keeps TRAILER_KEY from Python clients
MIRROR_KEY = "waypost-load-metrics-bin"

Clock = Callable[[], float]


class RateMeter:
    """Completed and failed calls per second of a LoadAccount, over windows of at least ``interval`` seconds."""

    def __init__(self, account: LoadAccount, clock: Clock = time.monotonic, interval: float = RATE_INTERVAL) -> None:
        self._account = account
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        self._t0 = clock()
        self._done0, self._failed0 = account.completed, account.failed
        self._rates: tuple[float, float] | None = None

    def read(self) -> tuple[float, float] | None:
        """(requests/s, errors/s) over the last complete window; None before the first one."""
        now = self._clock()
        with self._lock:
            dt = now - self._t0
            if dt >= self._interval:
                done, failed = self._account.completed, self._account.failed
                self._rates = ((done - self._done0) / dt, (failed - self._failed0) / dt)
                self._t0, self._done0, self._failed0 = now, done, failed
            return self._rates


def _mem_utilization() -> float | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
        total = os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return min(1.0, resident_pages / total) if total > 0 else None


class OrcaReporter:
    """Builds a server's ORCA reports (see the module doc). Thread-safe."""

    def __init__(self, account: LoadAccount | None, recorder: ServerMetricsRecorder | None = None,
                 clock: Clock = time.monotonic, cpu: CpuMeter | None = None) -> None:
        self.account = account
        self.recorder = recorder if recorder is not None else ServerMetricsRecorder()
        self._clock = clock
        self._cpu = cpu if cpu is not None else CpuMeter(wall=clock)
        self._rates = RateMeter(account, clock) if account is not None else None
        self._cache: tuple[float, int, bytes, tuple[tuple[str, bytes], ...]] = (-1e300, -1, b"", ())

    def report(self) -> Any:
        """The server's report now (an ``OrcaLoadReport``); requires xds-protos."""
        loaded = protos()
        assert loaded is not None, "ORCA reports need xds-protos"
        msg = loaded[0].OrcaLoadReport()
        fields, named = self.recorder.values()
        cpu = fields.get("cpu_utilization", None)
        if cpu is None:
            cpu = self._cpu.read()
        if cpu is not None:
            msg.cpu_utilization = cpu
        mem = fields.get("mem_utilization", None)
        msg.mem_utilization = mem if mem is not None else (_mem_utilization() or 0.0)
        app = fields.get("application_utilization", None)
        if app is None:
            app = application_value()
        if app is not None:
            msg.application_utilization = app
        rates = self._rates.read() if self._rates is not None else None
        rps = fields.get("rps_fractional", rates[0] if rates is not None else None)
        if rps is not None:
            msg.rps_fractional = rps
        eps = fields.get("eps", rates[1] if rates is not None else None)
        if eps is not None:
            msg.eps = eps
        for k, v in named.items():
            msg.utilization[k] = v
        return msg

    def _cached(self) -> tuple[float, int, bytes, tuple[tuple[str, bytes], ...]]:
        now = self._clock()
        entry = self._cache
        v = self.recorder.version
        if now - entry[0] < CACHE_SECONDS and entry[1] == v:
            return entry
        data = self.report().SerializeToString()
        entry = self._cache = (now, v, data, ((TRAILER_KEY, data), (MIRROR_KEY, data)))
        return entry

    def serialized(self) -> bytes:
        """The server report, serialized; rebuilt at most every CACHE_SECONDS or when the recorder changed."""
        return self._cached()[2]

    def trailer_metadata(self, call: CallMetricsRecorder | None) -> tuple[tuple[str, bytes], ...]:
        """The trailing metadata pairs of one call's report (cached when the call recorded nothing)."""
        if call is None:
            return self._cached()[3]
        data = self.trailer(call)
        return ((TRAILER_KEY, data), (MIRROR_KEY, data))

    def trailer(self, call: CallMetricsRecorder | None) -> bytes:
        """The bytes of one call's ``endpoint-load-metrics-bin`` trailer."""
        if call is None:
            return self.serialized()
        msg = self.report()
        fields, named = call.values()
        for k, v in fields.items():
            setattr(msg, k, v)
        for k, v in named.items():
            msg.utilization[k] = v
        cost, metrics = call.costs()
        for k, v in cost.items():
            msg.request_cost[k] = v
        for k, v in metrics.items():
            msg.named_metrics[k] = v
        return msg.SerializeToString()  # type: ignore[no-any-return]
