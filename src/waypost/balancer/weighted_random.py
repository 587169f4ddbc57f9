"""weighted_random: each call goes to a backend drawn at random with probability proportional to its weight.

Weights are the registrations' metadata ``weight`` as ``weights.weight_of`` reads it (missing or unparsable:
100; 0: drained, never picked while another backend has a positive weight; every READY backend drained: the
pick fails with UNAVAILABLE, the text smooth_weighted_round_robin uses). A bad value is logged once per backend and
value. Unlike smooth_weighted_round_robin, failures do not change the weights: it is stateless between picks, and
clients that start together do not move in step.

The pick is O(1): ``build`` lays out Walker's alias table (Vose's construction, O(n)); a pick reads one
``rng.random()``, whose integer part (times n) is a column and fraction chooses between the column's backend and
its alias.

Thread safety: the picker is immutable; ``random.Random.random`` is safe to call from many threads in CPython.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Backend
from .base import Picker, PickInfo, PickResult, Policy
from .stats import dedupe
from .weights import WeightMemo, no_backend

log = logging.getLogger("waypost.balancer.weighted_random")

__all__ = ["WeightedRandomPicker", "WeightedRandomPolicy", "alias_table"]


def alias_table(weights: Sequence[int]) -> tuple[list[float], list[int]]:
    """Vose's alias table for positive ``weights``: ``(prob, alias)``; column ``i`` is ``i`` with probability
    ``prob[i]``, else ``alias[i]``."""
    n = len(weights)
    total = sum(weights)
    scaled = [w * n / total for w in weights]
    prob = [1.0] * n
    alias = list(range(n))
    small = [i for i, s in enumerate(scaled) if s < 1.0]
    large = [i for i, s in enumerate(scaled) if s >= 1.0]
    while small and large:  # each step settles one column: at most n steps
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    return prob, alias  # columns left over (rounding) keep prob 1


class WeightedRandomPicker(Picker):
    def __init__(self, backends: Sequence[Backend], weights: Sequence[int], rng: random.Random) -> None:
        self._count = len(backends)
        kept = [(b, w) for b, w in zip(backends, weights) if w > 0]
        self._results = tuple(PickResult(b) for b, _ in kept)
        self._prob, self._alias = alias_table([w for _, w in kept]) if kept else ([], [])
        self._rng = rng

    def pick(self, info: PickInfo) -> PickResult:
        n = len(self._results)
        if not n:
            raise no_backend(WeightedRandomPolicy.name, self._count)
        u = self._rng.random() * n
        i = int(u)
        if i >= n:  # not reached: random() < 1
            i = n - 1
        return self._results[i if u - i < self._prob[i] else self._alias[i]]


class WeightedRandomPolicy(Policy):
    """Random choice proportional to registration weights (0 drains)."""

    name = "weighted_random"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._weights = WeightMemo(log)

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        used = self._weights.update(backends)
        return WeightedRandomPicker(backends, [used[b.address] for b in backends], self.rng)

    def weights(self) -> dict[str, int]:
        """address -> the weight used (for tests and introspection)."""
        return self._weights.current()
