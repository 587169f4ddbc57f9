"""One process-wide thread polling the connectivity of every sync backend channel.

grpcio's ``Channel.subscribe`` starts a polling thread per channel; with hundreds of backends that is
hundreds of threads. Here a single thread calls ``BalancerWrapper.poll()`` (a non-blocking
``check_connectivity_state`` per backend) every ``INTERVAL`` seconds.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

log = logging.getLogger("waypost.client")

#: 40 ms: a dropped connection is noticed within one interval (calls that fail on it demote it at once);
#: measured cost ~1.5 us per backend per poll.
INTERVAL = 0.04


class Polled(Protocol):
    """A sync channel's balancer, as the watcher thread sees it."""

    def poll(self) -> None:
        """Read every backend's connectivity now (one pass; on the watcher thread)."""


class _Watcher:
    def __init__(self) -> None:
        self._members: weakref.WeakSet[Polled] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, balancer: Polled) -> None:
        with self._lock:
            self._members.add(balancer)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="waypost-connectivity", daemon=True)
                self._thread.start()
        self._wake.set()

    def discard(self, balancer: Polled) -> None:
        with self._lock:
            self._members.discard(balancer)

    def _run(self) -> None:
        pid = os.getpid()
        while pid == os.getpid():
            members = list(self._members)
            if not members:
                # Sleep until a balancer registers (bounded so a dead member set is rechecked).
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            for b in members:
                try:
                    b.poll()
                except Exception:
                    log.exception("waypost: connectivity poll failed for %s", getattr(b, "target", b))
            del members
            self._wake.wait(INTERVAL)
            self._wake.clear()


WATCHER = _Watcher()
