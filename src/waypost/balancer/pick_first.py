"""pick_first: every call goes to one backend, over one connection (gRPC's default policy, gRFC A61).

Connections: the policy holds a connection to one address, as gRPC's pick_first does (``connections``): it
connects to the first address; only when that attempt fails does it try the next, keeping the failed ones
(they retry with backoff) until one address is usable, then it keeps that one and the channel closes the
others. When every address has failed, all of them retry and the first to connect wins. When the one in
use fails, it keeps retrying and the first address in order that has not failed is tried, and so on. A
channel with a policy that keeps the default (``Policy.connections``: all) is unchanged.

Picks: the channel builds pickers from READY backends only, so "move on when the first is not READY" falls
out of the rebuild. Like gRPC's pick_first, it is sticky: once a backend is in use it stays in use while
it is READY, even when an earlier address becomes READY later (e.g. the second address connected first
on a fresh channel); calls then never switch between two live backends. With ``shuffleAddressList`` (gRPC A62)
the order is randomised to spread clients over backends: each address gets a random rank from the policy's
rng when it first appears, and the order is by rank. The order is therefore stable: an unchanged address set
keeps its order, a new address lands at a random place without reshuffling the others. Ranks are dropped for
the addresses that leave the resolver's list (``order``, which ``connections`` calls with that list); ``build``
sees only the READY ones, so it keeps the others' ranks.

Thread safety: the picker is immutable; ``pick`` takes no lock. ``build`` and ``connections`` are serialised
by the channel.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import CONNECTING, READY, TRANSIENT_FAILURE, Backend
from .base import Picker, PickInfo, PickResult, Policy
from .config_fields import policy_config
from .stats import dedupe


class PickFirstPicker(Picker):
    def __init__(self, backend: Backend | None) -> None:
        self._result = PickResult(backend) if backend is not None else None

    def pick(self, info: PickInfo) -> PickResult:
        if self._result is None:
            raise NoBackendAvailable("pick_first: no READY backend")
        return self._result


class PickFirstPolicy(Policy):
    """Send every call to the first READY backend (optionally in a stable shuffled order), over one connection."""

    name = "pick_first"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._shuffle = bool(self.config.get("shuffleAddressList", False))
        self._ranks: dict[str, float] = {}  # address -> random rank (shuffleAddressList)
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
        """The backends in the order this policy tries them; ranks of addresses not in ``backends`` are dropped."""
        ordered = self._ranked(backends)
        if self._shuffle:
            self._ranks = {b.address: self._ranks[b.address] for b in ordered}
        return ordered

    def _ranked(self, backends: Sequence[Backend]) -> list[Backend]:
        backends = dedupe(backends)
        if not self._shuffle:
            return backends
        ranks = self._ranks
        for b in backends:  # the rng is drawn in list order, once per address first seen
            if b.address not in ranks:
                ranks[b.address] = self.rng.random()
        return sorted(backends, key=lambda b: ranks[b.address])

    def connections(self, backends: Sequence[Backend], states: Mapping[str, int]) -> Collection[str]:
        """The one usable address (the one in use, else the first in order); while none is usable, the one being
        tried and those that failed (retrying). The one being tried: a held connection still connecting (e.g.
        the one in use, its health answer pending: not dropped for a fresh one), else the first address in
        order without a connection."""
        ordered = self.order(backends)
        usable = [b.address for b in ordered if states.get(b.address) == READY]
        if usable:
            return (self._current if self._current in usable else usable[0],)
        trying = next((b.address for b in ordered if states.get(b.address) == CONNECTING), None)
        if trying is None:
            trying = next((b.address for b in ordered if b.address not in states), None)
        return [b.address for b in ordered if b.address == trying or states.get(b.address) == TRANSIENT_FAILURE]

    def build(self, backends: Sequence[Backend]) -> Picker:
        ordered = self._ranked(backends)
        chosen = next((b for b in ordered if b.address == self._current), None)
        if chosen is None and ordered:
            chosen = ordered[0]
        self._current = chosen.address if chosen is not None else None
        return PickFirstPicker(chosen)
