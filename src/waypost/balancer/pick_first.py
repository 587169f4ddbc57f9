"""pick_first: every call goes to one backend, over one connection (gRPC's default policy, gRFC A61).

Connections: the policy holds a connection to one address, as gRPC's pick_first does (``connections``), and
finds it the way gRPC's does ("Happy Eyeballs", gRFC A61): it connects to the first address; when that attempt
fails, or is still connecting after ``CONNECTION_ATTEMPT_DELAY`` (250 ms), it starts the next address too, while
the earlier attempts keep going (a failed one retries with backoff), and so on down the list; the first address
that becomes usable is kept and the channel closes the others. So an address that accepts TCP connections but
never completes the HTTP/2 handshake (a black hole) delays the first call by one delay, not by its deadline.
When every address has failed, all of them retry and the first to connect wins. When the one in use fails,
it keeps retrying and a new pass starts at the first address in order without a connection. The delay is
measured on the policy's clock; the channel asks ``connections`` again when ``connections_timer`` says so
(on its next connectivity poll). A channel with a policy that keeps the default (``Policy.connections``: all)
is unchanged.

Picks: the channel builds pickers from READY backends only, so "move on when the first is not READY" falls
out of the rebuild. Like gRPC's pick_first, it is sticky: once a backend is in use it stays in use while
it is READY, even when an earlier address becomes READY later (e.g. the second address connected first
on a fresh channel); calls then never switch between two live backends. With ``shuffleAddressList`` (gRPC A62)
the order is randomised to spread clients over backends: each address gets a random rank from the policy's
rng when it first appears, and the order is by rank. The order is therefore stable: an unchanged address set
keeps its order, a new address lands at a random place without reshuffling the others. Ranks are dropped for
the addresses that leave the resolver's list (``order``, which ``connections`` calls with that list); ``build``
sees only the READY ones, so it keeps the others' ranks.

Thread safety: the picker is immutable; ``pick`` takes no lock. ``build``, ``connections`` and
``connections_timer`` are serialised by the channel.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .. import metrics as _metrics
from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import CONNECTING, READY, TRANSIENT_FAILURE, Backend
from .base import Picker, PickInfo, PickResult, Policy
from .config_fields import policy_config
from .stats import dedupe

#: gRFC A61's Connection Attempt Delay: while the latest connection attempt is still connecting after this many
#: seconds, the next address is tried as well (gRPC's value; the earlier attempts are not cancelled).
CONNECTION_ATTEMPT_DELAY = 0.25


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

    def __init__(self, config: Mapping[str, Any] | None = None, *, connection_attempt_delay: float = CONNECTION_ATTEMPT_DELAY,
                 **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if not connection_attempt_delay >= 0:  # also rejects NaN
            raise ValueError(f"pick_first: connection_attempt_delay must be >= 0 seconds, got "
                             f"{connection_attempt_delay!r}")
        self.connection_attempt_delay = float(connection_attempt_delay)
        self._shuffle = bool(self.config.get("shuffleAddressList", False))
        self._ranks: dict[str, float] = {}  # address -> random rank (shuffleAddressList)
        self._current: str | None = None  # the address in use (builds are serialized by the channel)
        # The current pass over the addresses (none usable), for the attempt delay: when the latest attempt was
        # started (policy clock; None: no pass), which address it is (None: the pass began with attempts of an
        # earlier one still connecting), and when ``connections`` wants to be asked again (None: on a change only).
        self._attempt_at: float | None = None
        self._latest: str | None = None
        self._due: float | None = None
        self._seen: dict[str, int] = {}  # the states ``connections`` saw last (A78's connection metrics)

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
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
        """The one usable address (the one in use, else the first in order); while none is usable, every address
        with a connection (still connecting, or failed and retrying) plus, when the latest attempt failed or has
        been connecting for ``connection_attempt_delay`` seconds (or none is connecting), the first address in
        order without a connection: it starts a new attempt. A pass that begins with a held connection still
        connecting (e.g. the one in use, its health answer pending) waits one delay before starting another."""
        self._report(states)
        ordered = self.order(backends)
        usable = [b.address for b in ordered if states.get(b.address) == READY]
        if usable:
            self._attempt_at = self._latest = self._due = None
            return (self._current if self._current in usable else usable[0],)
        now = self.clock()
        if self._attempt_at is None:  # a pass begins: connections still connecting count as started now
            self._attempt_at = now
        fresh = [b.address for b in ordered if b.address not in states]
        connecting = [b.address for b in ordered if states.get(b.address) == CONNECTING]
        # the latest attempt failed (or left the list): the next one starts at once, as in A61
        waiting = self._latest in connecting if self._latest is not None else bool(connecting)
        start = None
        if fresh and (not waiting or now - self._attempt_at >= self.connection_attempt_delay):
            start = fresh.pop(0)
            self._attempt_at, self._latest, waiting = now, start, True
        # a timer only while an attempt is connecting and an address is left to start when it fires
        self._due = self._attempt_at + self.connection_attempt_delay if waiting and fresh else None
        return [b.address for b in ordered if b.address in states or b.address == start]

    def _report(self, states: Mapping[str, int]) -> None:
        """gRFC A78's pick_first metrics from the changes since the last ``connections``: an address that became
        usable (a connection attempt succeeded), one that went from connecting to failed (an attempt failed), the
        one in use no longer usable (a disconnection)."""
        seen, self._seen = self._seen, dict(states)
        obs = _metrics.current
        if obs is None:
            return
        for address, state in states.items():
            before = seen.get(address)
            if state == READY and before != READY:
                obs.pick_first_event(self.target, "connection_attempts_succeeded")
            elif state == TRANSIENT_FAILURE and before in (CONNECTING, None):
                obs.pick_first_event(self.target, "connection_attempts_failed")
        if self._current is not None and seen.get(self._current) == READY and states.get(self._current) != READY:
            obs.pick_first_event(self.target, "disconnections")

    def connections_timer(self) -> float | None:
        """Seconds until the attempt delay of the latest attempt runs out, when another address would then be
        started (0: now); None: nothing to start until a connection changes state."""
        if self._due is None:
            return None
        return max(self._due - self.clock(), 0.0)

    def build(self, backends: Sequence[Backend]) -> Picker:
        ordered = self._ranked(backends)
        chosen = next((b for b in ordered if b.address == self._current), None)
        if chosen is None and ordered:
            chosen = ordered[0]
        self._current = chosen.address if chosen is not None else None
        return PickFirstPicker(chosen)
