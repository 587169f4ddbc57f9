"""What a server knows about its own load: calls in flight, latency by load level, CPU, an app value.

A ``LoadAccount`` is fed by the load interceptor (``begin`` when a call starts, ``end`` when it ends)
and read by the load-report service (``report``). Every operation is O(1): a lock, a few additions.

Latency estimate at the current load. Each call is filed under the number of other calls in flight
when it started (its "requests in flight", RIF), in logarithmic buckets (0, 1, 2-3, 4-7, ... 1024+).
Each bucket keeps an exponentially weighted moving average of its calls' latencies (weight 1/8 per
sample: the last ~8 calls dominate), the average RIF of those calls and when it last got a sample.
The estimate for a call arriving now, at RIF ``r``:

- ``r``'s bucket, if it got a sample in the last ``FRESH_WINDOW`` seconds;
- otherwise the nearest bucket with a fresh sample: a lower one is scaled up by ``(r + 1) / (rif + 1)``
  (its calls saw less queueing: a saturated server's latency grows with the calls ahead of it, so
  this errs on the high side), a higher one is used as it is (more load than now: an upper bound);
- otherwise (nothing fresh) the most recently updated bucket, as above; absent when no call ever ended.

CPU utilization is the process's CPU time per wall-clock second over the cores it may use, measured
between reports at most every ``CPU_INTERVAL`` seconds (one ``process_time`` call per report).

The application value is process-wide (``set_load``): a number, or a callable read at each report.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("waypost.orca")

BUCKETS = 12  # RIF buckets: 0, 1, 2-3, 4-7, ..., 1024+
ALPHA = 1.0 / 8  # EWMA weight of a new latency sample within its bucket
FRESH_WINDOW = 10.0  # seconds: a bucket sample older than this is not "recent"
CPU_INTERVAL = 0.5  # seconds: shortest interval over which CPU utilization is measured

Clock = Callable[[], float]


def bucket_of(rif: int) -> int:
    """The latency bucket of a call that started with ``rif`` other calls in flight."""
    return min(rif.bit_length(), BUCKETS - 1)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """One reading of a LoadAccount (what a load report carries)."""

    in_flight: int
    latency_estimate: float | None  # seconds; None when no call has ended yet
    calls_completed: int
    calls_failed: int


class LoadAccount:
    """In-flight count and latency-by-load of one server. Thread-safe; every method is O(1)."""

    __slots__ = ("_clock", "_last", "_lat", "_lock", "_rif", "completed", "failed", "in_flight")

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.in_flight = 0
        self.completed = 0
        self.failed = 0
        self._lat = [0.0] * BUCKETS  # EWMA latency per bucket, seconds
        self._rif = [0.0] * BUCKETS  # EWMA of the RIF of the bucket's calls
        self._last = [-math.inf] * BUCKETS  # clock of the bucket's last sample

    def begin(self) -> tuple[int, float]:
        """A call starts: count it; returns the token to pass to ``end`` (its RIF and start time)."""
        with self._lock:
            rif = self.in_flight
            self.in_flight = rif + 1
        return rif, self._clock()

    def end(self, token: tuple[int, float], failed: bool = False) -> None:
        """The call started with ``token`` ended (``failed``: its handler raised)."""
        rif, start = token
        now = self._clock()
        latency = now - start
        b = rif.bit_length()
        if b >= BUCKETS:
            b = BUCKETS - 1
        with self._lock:
            self.in_flight -= 1
            self.completed += 1
            if failed:
                self.failed += 1
            if self._last[b] == -math.inf:  # first sample of the bucket: take it as it is
                self._lat[b] = latency
                self._rif[b] = float(rif)
            else:
                self._lat[b] += ALPHA * (latency - self._lat[b])
                self._rif[b] += ALPHA * (rif - self._rif[b])
            self._last[b] = now

    def latency_estimate(self, rif: int | None = None) -> float | None:
        """Estimated latency (seconds) of a call starting at ``rif`` (default: now); see the module doc."""
        now = self._clock()
        with self._lock:
            r = self.in_flight if rif is None else rif
            lat, rifs, last = list(self._lat), list(self._rif), list(self._last)
        b = bucket_of(r)
        if now - last[b] <= FRESH_WINDOW:
            return lat[b]
        src = -1
        for d in range(1, BUCKETS):  # nearest fresh bucket, the lower one first on a tie
            for j in (b - d, b + d):
                if 0 <= j < BUCKETS and now - last[j] <= FRESH_WINDOW:
                    src = j
                    break
            if src >= 0:
                break
        if src < 0:
            src = max(range(BUCKETS), key=lambda j: last[j])
            if last[src] == -math.inf:
                return None
        if src < b:
            return lat[src] * (r + 1) / (rifs[src] + 1)
        return lat[src]

    def snapshot(self) -> LoadSnapshot:
        with self._lock:
            in_flight, completed, failed = self.in_flight, self.completed, self.failed
        return LoadSnapshot(in_flight, self.latency_estimate(in_flight), completed, failed)


class CpuMeter:
    """Process CPU utilization between readings, over the cores this process may run on."""

    def __init__(self, wall: Clock = time.monotonic, cpu: Clock = time.process_time) -> None:
        self._wall, self._cpu = wall, cpu
        self._cores = _usable_cores()
        self._lock = threading.Lock()
        self._t0, self._c0 = wall(), cpu()
        self._value: float | None = None

    def read(self) -> float | None:
        """Utilization 0..1 over the last interval of at least CPU_INTERVAL seconds (None before that)."""
        now = self._wall()
        with self._lock:
            dt = now - self._t0
            if dt >= CPU_INTERVAL:
                c = self._cpu()
                self._value = min(1.0, max(0.0, (c - self._c0) / dt / self._cores))
                self._t0, self._c0 = now, c
            return self._value


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------- application value

AppValue = float | Callable[[], float] | None
_app_value: AppValue = None
_app_warned = False


def set_load(value: AppValue) -> None:
    """Set the application's own load value carried by this process's load reports.

    ``value``: a number >= 0 (larger is busier: a queue depth, a memory fraction...), a callable
    returning one (read at each report; keep it cheap), or None to report none.
    """
    global _app_value, _app_warned
    if value is not None and not callable(value):
        _check_value(value)
        value = float(value)
    _app_value = value
    _app_warned = False


def _check_value(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"set_load: expected a number >= 0, a callable or None, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"set_load: the load value must be a finite number >= 0, got {value!r}")
    return float(value)


def application_value() -> float | None:
    """The value set by ``set_load`` now (None when unset, or when its callable failed: logged once)."""
    global _app_warned
    v = _app_value
    if v is None or isinstance(v, float):
        return v
    try:
        value = _check_value(v())
    except Exception as e:  # noqa: BLE001 -- an app callback must never break a load report
        if not _app_warned:
            _app_warned = True
            log.warning("set_load callback %r failed (%s); reports carry no application value until it "
                        "works again", v, e)
        return None
    _app_warned = False
    return value
