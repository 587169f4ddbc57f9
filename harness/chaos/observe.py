"""What the chaos scenarios look at: registrations read through an etcd registry of their own, every state a
client went through (``History``, ``convergence``), and the library's recent log lines to explain a failure."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from harness.waiting import holds_within
from waypost import _loop
from waypost.etcd.config import EtcdConfig
from waypost.registries.etcd.store import EtcdRegistry


def private_registry(endpoints: list[str]) -> EtcdRegistry:
    """An etcd registry of its own (its own connection and watches), not connect()'s shared one."""
    return EtcdRegistry(EtcdConfig(endpoints=tuple(endpoints)))


def close_registry(reg: EtcdRegistry) -> None:
    with contextlib.suppress(Exception):
        _loop.run(reg.close(), 15)


def registered_values(reg: EtcdRegistry, key: str, timeout: float = 2.0) -> set[str] | None:
    """The addresses registered under ``key/`` now, or None if etcd does not answer within ``timeout``."""
    try:
        res = _loop.run(reg.get(key + "/", prefix=True), timeout)
    except Exception:  # noqa: BLE001  # unreachable right now: the caller polls again
        return None
    return {kv.value.decode() for kv in res.kvs}


class _RecentLog(logging.Handler):
    """The library's INFO+ log lines with their monotonic time (bounded), to explain a failure."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=2000)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), f"{record.levelname} {record.name}: {record.getMessage()[:300]}"))

    def around(self, t: float, before: float = 2.0, after: float = 0.5) -> list[str]:
        return [f"{ts - t:+.3f}s {text}" for ts, text in list(self.lines) if t - before <= ts <= t + after][-30:]


    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Capture the library's INFO+ lines meanwhile (the logger's level is restored afterwards)."""
        wp = logging.getLogger("waypost")
        old = wp.level
        if wp.getEffectiveLevel() > logging.INFO:
            wp.setLevel(logging.INFO)
        wp.addHandler(self)
        try:
            yield
        finally:
            wp.removeHandler(self)
            wp.setLevel(old)


LOG = _RecentLog()


class History:
    """Every state a client went through, timestamped by its change listener (so the moment a client
    reached its final state is known exactly, not when we happened to look)."""

    def __init__(self, read: Callable[[], set[str]]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self.changes: list[tuple[float, frozenset[str]]] = [(time.monotonic(), frozenset(read()))]

    def __call__(self) -> None:
        now = time.monotonic()
        v = frozenset(self._read())
        with self._lock:
            if v != self.changes[-1][1]:
                self.changes.append((now, v))

    def settled_at(self, final: set[str]) -> float | None:
        """When this client last changed, if it holds ``final`` now; None if it does not."""
        with self._lock:
            t, v = self.changes[-1]
        return t if v == final else None


def convergence(histories: list[History], live: set[str], t_end: float, timeout: float) -> float | None:
    """Seconds from ``t_end`` until every client held ``live`` for good (0 if they already did), waiting up
    to ``timeout``; None if some client never got there."""
    if not holds_within(lambda: all(h.settled_at(live) is not None for h in histories), timeout, interval=0.01):
        return None
    time.sleep(0.3)  # a late straggler event would show up as a further change
    settled = [h.settled_at(live) for h in histories]
    if any(t is None for t in settled):
        return None
    return max(0.0, max(t for t in settled if t is not None) - t_end)


class LogCounter(logging.Handler):
    """Counts log records of ``logger`` whose message contains ``needle`` (evidence a path was taken)."""

    def __init__(self, logger: str, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.count = 0
        self._logger = logging.getLogger(logger)
        self._old_level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.WARNING:
            self._logger.setLevel(logging.WARNING)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.count += 1

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)
        super().close()
