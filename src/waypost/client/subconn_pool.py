"""Subconn lifecycle: one backend channel per address, created, drained after removal, revived, closed.

A removed backend keeps its channel while calls still run on it (``draining``), at least ``CLOSE_GRACE``
and at most ``DRAIN_TIMEOUT`` seconds; an address that comes back meanwhile gets its old channel back. The
caller (the balancer wrapper) holds its lock around every method here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import metrics as _metrics
from ..types import Backend
from .subconn import SubConn

log = logging.getLogger("waypost.client")

#: Removed backends keep their channel until their in-flight calls end, at most this long.
DRAIN_TIMEOUT = 60.0
#: ... and at least this long: a call may have picked the backend from the previous snapshot a moment before
#: its removal and not yet started (closing a grpc channel under a call being created crashes grpc). An
#: address that comes back meanwhile gets its old channel back (no reconnect under registration flapping).
CLOSE_GRACE = 1.0


class SubConnPool:
    """The subconns of one channel: ``active`` by address, and the removed ones still ``draining``.

    ``make_channel(address)`` creates a backend channel, ``probe(channel)`` returns a function
    ``f(try_to_connect) -> int`` giving its connectivity (called every poll, so it should be a direct
    C-level bound method where possible), ``close_channel(channel)`` releases it. ``start_health(subconn)``
    (optional) starts a health watch and returns a handle that ``stop_health(handle)`` cancels.
    """

    def __init__(
        self,
        target: str,
        *,
        make_channel: Callable[[str], Any],
        probe: Callable[[Any], Callable[[bool], int]],
        close_channel: Callable[[Any], None],
        start_health: Callable[[SubConn], Any] | None = None,
        stop_health: Callable[[Any], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self._make_channel = make_channel
        self._probe = probe
        self._close_channel = close_channel
        self._start_health = start_health
        self._stop_health = stop_health
        self._clock = clock
        self.active: dict[str, SubConn] = {}
        self.draining: list[SubConn] = []

    def add(self, b: Backend) -> tuple[SubConn, bool]:
        """A subconn for new address ``b``: a draining one revived with its open channel (True), or a new one
        (False). A revived one's connectivity is stale: the caller probes it."""
        sc = self._revive(b)
        if sc is not None:
            self.active[b.address] = sc
            return sc, True
        sc = SubConn(b, self._make_channel(b.address), health=self._start_health is not None)
        sc.probe = self._probe(sc.channel)
        try:
            # Start connecting now so the first call does not wait for the next poll.
            sc.state = sc.probe(True)
        except Exception:
            log.exception("waypost: could not query backend channel %s", b.address)
        if self._start_health is not None:
            sc.health_task = self._start_health(sc)
        self.active[b.address] = sc
        return sc, False

    def _revive(self, b: Backend) -> SubConn | None:
        for i, sc in enumerate(self.draining):
            if sc.address == b.address:
                del self.draining[i]
                sc.removed = False
                sc.backend = b
                if self._start_health is not None:
                    sc.healthy = None
                    sc.health_task = self._start_health(sc)
                return sc
        return None

    def remove(self, sc: SubConn) -> None:
        """Out of service now; its channel is closed by ``reap`` once its calls ended (never here)."""
        del self.active[sc.address]
        sc.removed = True
        sc.removed_at = self._clock()
        self._stop_health_of(sc)
        self.draining.append(sc)

    def reap(self) -> None:
        """Close the draining channels whose calls ended (after the grace) or that drained too long."""
        if not self.draining:
            return
        now = self._clock()
        keep = []
        for sc in self.draining:
            age = now - sc.removed_at
            if (sc.inflight <= 0 and age >= CLOSE_GRACE) or age > DRAIN_TIMEOUT:
                self._release(sc)
            else:
                keep.append(sc)
        self.draining = keep

    def close_all(self) -> list[SubConn]:
        """Remove and release every subconn (channel close); returns them."""
        scs = list(self.active.values()) + self.draining
        self.active = {}
        self.draining = []
        for sc in scs:
            sc.removed = True
            self._stop_health_of(sc)
            self._release(sc)
        return scs

    def forget_after_fork(self) -> None:
        """In a forked child: drop every inherited subconn without touching its (unusable) channel. Health
        checking stops for the channel (``waypost._fork.health_checks_allowed`` says why)."""
        self.active = {}
        self.draining = []
        if self._start_health is not None:
            from .. import _fork

            if _fork.health_checks_allowed("", self.target) is None:
                self._start_health = self._stop_health = None

    def _stop_health_of(self, sc: SubConn) -> None:
        if sc.health_task is not None and self._stop_health is not None:
            try:
                self._stop_health(sc.health_task)
            except Exception:
                log.exception("waypost: stopping health watch of %s", sc.address)
            sc.health_task = None

    def _release(self, sc: SubConn) -> None:
        obs = _metrics.current
        if obs is not None:
            obs.backend_removed(self.target, sc.address)
        sc.mcs.clear()
        try:
            self._close_channel(sc.channel)
        except Exception:
            log.exception("waypost: closing backend channel %s", sc.address)
