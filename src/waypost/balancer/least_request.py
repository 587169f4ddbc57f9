"""least_request: power of ``choiceCount`` choices on the in-flight request count (gRPC A48).

Each pick draws ``choiceCount`` backends at random (with replacement, as grpc-go does) and takes the
one with the fewest calls in flight (the first drawn on ties). In-flight counts are kept in the
policy by address, so they survive rebuilds, and a ``done`` from an older picker still decrements
the right counter.

Thread safety: one ``threading.Lock`` per policy guards the counters' increments and decrements;
the comparison reads them without the lock (a slightly stale count only changes a tie-break).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import Backend
from .base import DoneHook, Outcome, Picker, PickInfo, PickResult, Policy, parse_config_object
from .stats import StatsTable, dedupe

DEFAULT_CHOICE_COUNT = 2
MIN_CHOICE_COUNT = 2
MAX_CHOICE_COUNT = 10


class _Inflight:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class LeastRequestPicker(Picker):
    def __init__(self, policy: LeastRequestPolicy, backends: Sequence[Backend],
                 counters: Sequence[_Inflight]) -> None:
        self._policy = policy
        self._backends = tuple(backends)
        self._counters = tuple(counters)

    def pick(self, info: PickInfo) -> PickResult:
        n = len(self._backends)
        if n == 0:
            raise NoBackendAvailable("least_request: no READY backend")
        policy = self._policy
        rng = policy.rng
        best = rng.randrange(n)
        for _ in range(policy.choice_count - 1):
            i = rng.randrange(n)
            if self._counters[i].count < self._counters[best].count:
                best = i
        counter = self._counters[best]
        with policy._lock:
            counter.count += 1
        return PickResult(self._backends[best], policy._done_hook(counter))


class LeastRequestPolicy(Policy):
    """Pick the least loaded of ``choiceCount`` random backends, by calls in flight."""

    name = "least_request"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.choice_count = int(self.config.get("choiceCount", DEFAULT_CHOICE_COUNT))
        self._lock = threading.Lock()
        self._counters: StatsTable[_Inflight] = StatsTable(lambda _b: _Inflight())

    @classmethod
    def parse_config(cls, raw: Any, path: str) -> dict[str, Any]:
        cfg = parse_config_object(raw, path)
        unknown = set(cfg) - {"choiceCount"}
        if unknown:
            raise InvalidServiceConfig(f"{path}.{min(unknown)}: unknown field for least_request")
        if "choiceCount" in cfg:
            n = cfg["choiceCount"]
            if isinstance(n, float) and n.is_integer():
                n = int(n)
            if isinstance(n, bool) or not isinstance(n, int):
                raise InvalidServiceConfig(f"{path}.choiceCount: expected an integer, got {n!r}")
            if not MIN_CHOICE_COUNT <= n <= MAX_CHOICE_COUNT:
                raise InvalidServiceConfig(
                    f"{path}.choiceCount: must be between {MIN_CHOICE_COUNT} and {MAX_CHOICE_COUNT}, got {n}"
                )
            cfg["choiceCount"] = n
        return cfg

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        with self._lock:
            counters = self._counters.sync(backends)
        return LeastRequestPicker(self, backends, counters)

    def _done_hook(self, counter: _Inflight) -> DoneHook:
        def done(outcome: Outcome) -> None:
            with self._lock:
                counter.count -= 1

        return done

    def inflight(self) -> dict[str, int]:
        """address -> calls in flight."""
        with self._lock:
            return {addr: c.count for addr, c in self._counters.items()}
