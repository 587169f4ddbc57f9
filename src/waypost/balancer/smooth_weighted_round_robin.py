"""smooth_weighted_round_robin: nginx's smooth weighted round robin with dynamic (effective) weights.

Not to be confused with ``weighted_round_robin``, gRPC's policy (A58) over ORCA load reports
(``weighted_round_robin.py``).

Origin: nginx SWRR, as Kratos uses it and as the seed (002) explains it. Each pick adds every
backend's effective weight to its current weight, picks the largest current weight (first one on
ties) and subtracts the total from it; weights 10:20:30 for A, B, C give C B A C B C.

Weights come from the registration metadata ``weight``; ``weights.weight_of`` decides what a value
means (missing or unparsable: 100; 0: drained, never picked while another backend has a positive
weight; every backend drained: the pick fails with UNAVAILABLE saying so). A bad value is logged once
per backend. Drained backends are left out of the picker entirely, so the dynamic weights below
(which may reset a current weight to 0) can never hand them a pick.

Dynamic weights (seed 002, section 7): a call that ends with a failure code (``stats.FAILURE_CODES``)
halves the backend's effective weight (floor 1: a penalty never drains) and resets its current
weight to 0; each successful call adds 1 back, up to the configured weight (additive recovery, like nginx's
``effective_weight++``: a halved weight of 100 needs 50 successes to be whole again).

Statistics (effective and current weights) survive rebuilds for backends that stay; a changed
``weight`` in the metadata resets the effective weight to the new configured weight.

Thread safety: one ``threading.Lock`` per policy guards the weights; ``pick`` and ``done`` hold it
for a few arithmetic operations per backend.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import NoBackendAvailable
from ..types import Backend
from .base import DoneHook, Outcome, Picker, PickInfo, PickResult, Policy
from .stats import StatsTable, dedupe, is_failure
from .weights import DEFAULT_WEIGHT, no_backend, parse_weight, weight_of

log = logging.getLogger("waypost.balancer.smooth_weighted_round_robin")

__all__ = ["DEFAULT_WEIGHT", "SmoothWeightedRoundRobinPicker", "SmoothWeightedRoundRobinPolicy", "parse_weight"]

_MISSING = object()


class _WeightState:
    __slots__ = ("address", "current", "effective", "raw", "weight")

    def __init__(self, address: str, raw: object, weight: int) -> None:
        self.address = address
        self.raw = raw  # the metadata value the weight was parsed from (to notice changes)
        self.weight = weight  # configured; 0 = drained
        self.effective = weight  # dynamic, 1..weight (0 while drained)
        self.current = 0


class SmoothWeightedRoundRobinPicker(Picker):
    def __init__(self, policy: SmoothWeightedRoundRobinPolicy, backends: Sequence[Backend],
                 states: Sequence[_WeightState]) -> None:
        self._policy = policy
        self._count = len(backends)
        # Drained backends (weight 0) never enter the rotation.
        self._entries = tuple((b, st) for b, st in zip(backends, states) if st.weight > 0)

    def pick(self, info: PickInfo) -> PickResult:
        if not self._entries:
            raise no_backend(SmoothWeightedRoundRobinPolicy.name, self._count)
        with self._policy._lock:
            total = 0
            best: tuple[Backend, _WeightState] | None = None
            for entry in self._entries:
                st = entry[1]
                st.current += st.effective
                total += st.effective
                if best is None or st.current > best[1].current:
                    best = entry
            if best is None:  # not reached: every entry has an effective weight of 1 or more
                raise NoBackendAvailable("smooth_weighted_round_robin: no READY backend")
            best[1].current -= total
        backend, state = best
        return PickResult(backend, self._policy._done_hook(state))


class SmoothWeightedRoundRobinPolicy(Policy):
    """Smooth weighted round robin over metadata weights, penalising failures."""

    name = "smooth_weighted_round_robin"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._lock = threading.Lock()
        self._states: StatsTable[_WeightState] = StatsTable(
            lambda b: _WeightState(b.address, b.metadata.get("weight", _MISSING), self._weight_of(b))
        )

    def _weight_of(self, backend: Backend) -> int:
        weight, problem = weight_of(backend.metadata)
        if problem is not None:
            log.warning("backend %s: %s", backend.address, problem)
        return weight

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        with self._lock:
            states = self._states.sync(backends)
            for b, st in zip(backends, states):
                raw = b.metadata.get("weight", _MISSING)
                if raw != st.raw:  # a kept backend re-registered with another weight
                    st.raw = raw
                    st.weight = st.effective = self._weight_of(b)
                    st.current = 0
        return SmoothWeightedRoundRobinPicker(self, backends, states)

    def _done_hook(self, state: _WeightState) -> DoneHook:
        def done(outcome: Outcome) -> None:
            with self._lock:
                if state.weight == 0:  # drained since the pick: nothing to adjust
                    return
                if is_failure(outcome.code):
                    state.effective = max(1, state.effective // 2)
                    state.current = 0
                elif state.effective < state.weight:
                    state.effective += 1

        return done

    def effective_weights(self) -> dict[str, int]:
        """address -> current effective weight (for tests and introspection)."""
        with self._lock:
            return {addr: st.effective for addr, st in self._states.items()}
