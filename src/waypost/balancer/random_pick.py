"""random: each call goes to a backend chosen uniformly at random with the policy's rng.

Thread safety: ``random.Random.randrange`` is safe to call from many threads in CPython (the
generator's state is updated under the GIL); the picker is otherwise immutable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..errors import NoBackendAvailable
from ..types import Backend
from .base import Picker, PickInfo, PickResult, Policy
from .stats import dedupe


class RandomPicker(Picker):
    def __init__(self, backends: Sequence[Backend], rng: random.Random) -> None:
        self._results = tuple(PickResult(b) for b in backends)
        self._rng = rng

    def pick(self, info: PickInfo) -> PickResult:
        if not self._results:
            raise NoBackendAvailable("random: no READY backend")
        return self._results[self._rng.randrange(len(self._results))]


class RandomPolicy(Policy):
    """Uniformly random choice among the READY backends."""

    name = "random"

    def build(self, backends: Sequence[Backend]) -> Picker:
        return RandomPicker(dedupe(backends), self.rng)
