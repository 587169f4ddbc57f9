"""round_robin: rotate over the READY backends, starting at a random index (as grpc-go does, so
that many clients do not all hit the first backend together).

Thread safety: the index comes from ``itertools.count``, whose ``next`` is atomic in CPython, so
concurrent picks never skip or repeat a slot; the picker is otherwise immutable.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..errors import NoBackendAvailable
from ..types import Backend
from .base import Picker, PickInfo, PickResult, Policy
from .stats import dedupe


class RoundRobinPicker(Picker):
    def __init__(self, backends: Sequence[Backend], start: int) -> None:
        self._results = tuple(PickResult(b) for b in backends)
        self._counter = itertools.count(start)

    def pick(self, info: PickInfo) -> PickResult:
        n = len(self._results)
        if n == 0:
            raise NoBackendAvailable("round_robin: no READY backend")
        return self._results[next(self._counter) % n]


class RoundRobinPolicy(Policy):
    """Rotate over the READY backends from a random starting index."""

    name = "round_robin"

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        start = self.rng.randrange(len(backends)) if backends else 0
        return RoundRobinPicker(backends, start)
