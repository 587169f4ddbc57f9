"""Slow start: a backend that just appeared takes a growing share of the picks over ``slowStartWindow``.

A server that just started (or came back) may still be warming up: cold caches, a JIT, connection pools
being filled. A latency-aware policy cannot see that before the first replies come back, and until then a
newcomer looks as good as any backend, or better (go-zero's p2c starts it with no latency at all). Slow start
(Envoy's name for it) limits its share while it warms up.

The ramp: a backend first seen ``elapsed`` seconds ago, with ``elapsed < window``, takes part in a pick's
comparison with probability ``max(MIN_FACTOR, elapsed / window)`` (linear, never below 10 %: a newcomer is
never starved, so it is measured and warms up). A P2C pick (peak_ewma, p2c_ewma) whose pair holds one
backend that is not admitted takes the other one; least_request compares only the admitted ones among its
``choiceCount`` draws (when none is, it draws single backends again, up to ``choiceCount`` times); prequal's pool choice considers a probe of a
ramping backend with the same probability. So a ramping backend gets at most its factor times the share it
would otherwise get, and the full share once the window is over. Scaling the backend's load instead (Envoy's
way with weights) would do nothing for a backend with no latency sample yet, whose load is the lowest of all.

The window counts per address from the build that first holds it (``StatsTable`` drops the statistics of a
backend that leaves, so one that comes back starts again), on the policy clock. Backends of the policy's first
build with any backend, and those that appear within ``STARTUP_GRACE`` seconds of it, do not ramp: a channel
connects to its backends one by one, and ramping the ones that happen to be READY a moment later would only
shift the load onto the first ones.

The rng is drawn only for a backend inside its window, so with slow start off (``slowStartWindow`` absent or
``"0s"``) a policy's pick sequence is exactly what it was without this module.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from ..durations import parse_config_duration

__all__ = ["FIELD", "MIN_FACTOR", "STARTUP_GRACE", "SlowStart", "parse_window"]

FIELD = "slowStartWindow"
#: the least share factor of a backend in its window (a newcomer is never starved)
MIN_FACTOR = 0.1
#: seconds after the first build with backends during which appearing backends do not ramp (channel start)
STARTUP_GRACE = 1.0
NOT_RAMPING = -math.inf  # the "first seen" of a backend that does not ramp


def parse_window(cfg: dict[str, Any], path: str) -> None:
    """Validate ``cfg["slowStartWindow"]`` in place (a gRPC duration, ``"0s"`` = off) when present."""
    if FIELD in cfg:
        cfg[FIELD] = parse_config_duration(cfg[FIELD], f"{path}.{FIELD}")


class SlowStart:
    """The ramp of one policy: ``window`` seconds (0: off), read on ``rng`` (the policy's)."""

    __slots__ = ("_rng", "_since", "window")

    def __init__(self, window: float, rng: random.Random) -> None:
        self.window = float(window)
        self._rng = rng
        self._since: float | None = None  # the time of the first build with backends

    @classmethod
    def of(cls, config: Mapping[str, Any], rng: random.Random) -> SlowStart:
        """The ramp a policy's validated config sets (``slowStartWindow``; absent: off)."""
        return cls(float(config.get(FIELD, 0.0)), rng)

    def on_build(self, now: float, count: int) -> None:
        """Note a build of ``count`` backends (call before creating the new backends' statistics)."""
        if self._since is None and count:
            self._since = now

    def born(self, now: float) -> float:
        """The ramp start of a backend first seen at ``now``: ``now``, or ``NOT_RAMPING`` (off, or channel start)."""
        if self.window <= 0.0 or self._since is None or now - self._since <= STARTUP_GRACE:
            return NOT_RAMPING
        return now

    def factor(self, born: float, now: float) -> float:
        """The share factor, ``MIN_FACTOR`` to 1, of a backend whose ramp started at ``born``."""
        elapsed = now - born
        if elapsed >= self.window:
            return 1.0
        return max(MIN_FACTOR, elapsed / self.window)

    def only_admitted(self, born_a: float, born_b: float, now: float) -> int | None:
        """For a P2C pair whose ramps started at ``born_a`` and ``born_b``: 0 or 1 when exactly that one of the
        two takes part in this pick (the other ramps and is not admitted), else None (compare the pair as usual).
        Draws the rng only for a ramping member of a pair that differs in its ramp, ``a`` first."""
        if not self.window or born_a == born_b:
            return None
        admit_a, admit_b = self.admits(born_a, now), self.admits(born_b, now)
        if admit_a == admit_b:
            return None
        return 0 if admit_a else 1

    def admits(self, born: float, now: float) -> bool:
        """Whether a backend whose ramp started at ``born`` takes part in this pick (draws the rng only while
        it ramps)."""
        if now - born >= self.window:
            return True
        return self._rng.random() < self.factor(born, now)
