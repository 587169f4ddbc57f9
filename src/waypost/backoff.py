"""Reconnect backoff: how long a loop waits after a run of failures before it tries again.

``Backoff(first, cap, jitter).delay(failures, rng)``: ``first`` seconds after the first failure, doubling with
each further one up to ``cap``, then multiplied by a random factor in ``[1 - jitter, 1 + jitter]`` so that many
clients that lost the same server do not come back to it in step. ``RECONNECT`` holds the figures the
registry resolvers use (0.5 s doubling up to 10 s, +-20%).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: doublings beyond this cannot matter (2**64 times any sensible ``first`` is past any cap), and an unbounded
#: exponent would overflow a float after about a thousand failures (hours of outage at a 10 s cap)
_MAX_DOUBLINGS = 64


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with a cap and jitter; see the module docstring. Seconds throughout."""

    first: float
    cap: float
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff: need 0 < first <= cap, got first={self.first!r} cap={self.cap!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff: jitter must be in [0, 1), got {self.jitter!r}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The pause after ``failures`` failures in a row (1: the first; 0 counts as 1). ``rng`` draws the
        jitter (default: the ``random`` module's shared generator)."""
        base = min(self.first * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS), self.cap)
        if not self.jitter:
            return base
        low, high = 1 - self.jitter, 1 + self.jitter
        return base * (rng.uniform(low, high) if rng is not None else random.uniform(low, high))


#: the registry resolvers' reconnect pauses (Consul, Kubernetes, ZooKeeper): 0.5 s doubling up to 10 s, +-20%
RECONNECT = Backoff(first=0.5, cap=10.0, jitter=0.2)

__all__ = ["RECONNECT", "Backoff"]


#: go-zero's coolDownInterval between a registry's retries, and its jitter (+-5%)
COOL_DOWN = 1.0
COOL_DOWN_DEVIATION = 0.05


def cool_down(rng: random.Random | None = None, base: float = COOL_DOWN) -> float:
    """go-zero's retry pause: ``base`` seconds +-5%."""
    r = rng.random() if rng is not None else random.random()
    return base * (1 - COOL_DOWN_DEVIATION + 2 * COOL_DOWN_DEVIATION * r)
