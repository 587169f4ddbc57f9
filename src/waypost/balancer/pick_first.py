"""pick_first: every call goes to the first backend (gRPC's default policy).

The channel builds pickers from READY backends only, so "move on when the first is not READY" falls
out of the rebuild. Like gRPC's pick_first, it is sticky: once a backend is in use it stays in use while
it is READY, even when an earlier address becomes READY later (e.g. the second address connected first
on a fresh channel); calls then never switch between two live backends. With ``shuffleAddressList`` (gRPC A62) the order is randomised to spread clients
over backends: each address gets a random rank from the policy's rng when it first appears, and the
order is by rank. The order is therefore stable across rebuilds: an unchanged address set keeps its
order, a new address lands at a random place without reshuffling the others.

Thread safety: the picker is immutable; ``pick`` takes no lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import Backend
from .base import Picker, PickInfo, PickResult, Policy
from .config_fields import policy_config
from .stats import StatsTable, dedupe


class PickFirstPicker(Picker):
    def __init__(self, backend: Backend | None) -> None:
        self._result = PickResult(backend) if backend is not None else None

    def pick(self, info: PickInfo) -> PickResult:
        if self._result is None:
            raise NoBackendAvailable("pick_first: no READY backend")
        return self._result


class PickFirstPolicy(Policy):
    """Send every call to the first READY backend (optionally in a stable shuffled order)."""

    name = "pick_first"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._shuffle = bool(self.config.get("shuffleAddressList", False))
        self._ranks: StatsTable[float] = StatsTable(lambda _b: self.rng.random())
        self._current: str | None = None  # the address in use (builds are serialized by the channel)

    @classmethod
    def parse_config(cls, raw: Any, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, ("shuffleAddressList",))
        if "shuffleAddressList" in cfg and not isinstance(cfg["shuffleAddressList"], bool):
            raise InvalidServiceConfig(
                f"{path}.shuffleAddressList: expected a boolean, got {cfg['shuffleAddressList']!r}"
            )
        return cfg

    def order(self, backends: Sequence[Backend]) -> list[Backend]:
        """The backends in the order this policy tries them."""
        backends = dedupe(backends)
        if not self._shuffle:
            return backends
        ranks = self._ranks.sync(backends)
        return [b for _, b in sorted(zip(ranks, backends), key=lambda rb: rb[0])]

    def build(self, backends: Sequence[Backend]) -> Picker:
        ordered = self.order(backends)
        chosen = next((b for b in ordered if b.address == self._current), None)
        if chosen is None and ordered:
            chosen = ordered[0]
        self._current = chosen.address if chosen is not None else None
        return PickFirstPicker(chosen)
