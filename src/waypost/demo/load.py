"""Closed-loop load through a waypost channel: N threads, each calling as fast as answers come back."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc

from .backend import METHOD


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the load started, at the end of the call
    latency: float  # seconds, as the client saw it (retries included)
    backend: str | None  # the name in the answer (None on error)
    error: str | None = None  # status code name on failure
    key: str | None = None  # the consistent-hash key used, if any


class Load:
    """Runs ``threads`` callers until ``stop()`` or ``duration``; ``samples`` grows as calls end."""

    def __init__(self, channel: grpc.Channel, threads: int, *, duration: float | None = None,
                 hash_keys: int = 0, timeout: float = 3.0) -> None:
        self.call = channel.unary_unary(METHOD)  # raw bytes in and out
        self.threads = threads
        self.duration = duration
        self.hash_keys = hash_keys
        self.timeout = timeout
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self) -> Load:
        self.t0 = time.monotonic()
        for i in range(self.threads):
            w = threading.Thread(target=self._run, args=(i,), name=f"demo-load-{i}", daemon=True)
            w.start()
            self._workers.append(w)
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _run(self, index: int) -> None:
        from ..client.hashkey import hash_key

        n = 0
        end = None if self.duration is None else self.t0 + self.duration
        while not self._stop.is_set() and (end is None or time.monotonic() < end):
            key = f"user-{(index * 7919 + n) % self.hash_keys}" if self.hash_keys else None
            n += 1
            start = time.monotonic()
            try:
                if key is not None:
                    with hash_key(key):
                        reply = self.call(b"hello", timeout=self.timeout)
                else:
                    reply = self.call(b"hello", timeout=self.timeout)
                s = Sample(time.monotonic() - self.t0, time.monotonic() - start, reply.decode(), None, key)
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                s = Sample(time.monotonic() - self.t0, time.monotonic() - start, None,
                           code.name if code is not None else type(e).__name__, key)
            with self._lock:
                self.samples.append(s)

    def stop(self) -> list[Sample]:
        self._stop.set()
        return self.join()

    def join(self, timeout: float = 30.0) -> list[Sample]:
        deadline = time.monotonic() + timeout
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return list(self.samples)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def summarize(samples: list[Sample], names: list[str]) -> dict[str, Any]:
    """Calls, errors, p50/p99 (ms) and share per backend."""
    ok = [s for s in samples if s.error is None]
    lat = [s.latency * 1000 for s in ok]
    counts = {n: 0 for n in names}
    for s in ok:
        if s.backend is not None:
            counts[s.backend] = counts.get(s.backend, 0) + 1
    per_backend = {}
    for n, c in counts.items():
        b_lat = [s.latency * 1000 for s in ok if s.backend == n]
        per_backend[n] = {"calls": c, "share": c / len(ok) if ok else 0.0,
                          "p50_ms": percentile(b_lat, 50), "p99_ms": percentile(b_lat, 99)}
    errors: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    return {"calls": len(samples), "ok": len(ok), "errors": sum(errors.values()), "error_codes": errors,
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "backends": per_backend}
