"""The probe pool of the ``prequal`` policy and its hot-cold lexicographic (HCL) choice.

After "Load is not what you should balance: Introducing Prequal" (Wydrowski, Kleinberg, Rumble; NSDI '24). A probe
is what one backend's load-report service answered: its requests in flight (RIF, from all clients) and its latency
estimate at that load. Probes arrive asynchronously, off the call path; the pool keeps the most recent few and a pick
reads only the pool, so a pick costs O(pool size), never O(backends), and never waits for a probe.

The choice (HCL): a probe is *hot* when its RIF is above the ``rif_quantile`` of the RIFs that recent probes reported
(the last ``history`` answers, a wider view than the few probes the pool holds, so the whole pool may be hot). If any
probe is cold, pick the cold one with the lowest latency estimate (latency is what we want to balance); if all are
hot, pick the one with the fewest requests in flight (queueing is what makes them hot). Ties are broken by the
injected random source, so equal backends share the load.

A probe is a photograph; our own calls since are known for sure. So the RIF compared is the reported one with this
client's part brought up to date: ``reported - ours then + ours now`` (never below ours now), the caller giving its
in-flight count per backend (``own``); without ``own``, each use of the probe counts as one more call. When that RIF
is above the reported one, the latency estimate grows in proportion (``(rif + 1) / (reported + 1)``: the calls ahead
of ours queue, as the server's own estimate assumes between load levels).

Pool hygiene, each rule for a reason:
- at most one probe per backend: a fresher answer replaces the older one (two answers of one backend would count it
  twice in the quantile);
- a probe older than ``max_age`` is dropped (load moves; a stale "idle" answer attracts a herd);
- a probe is used at most ``reuse_budget`` times, so a burst of picks spreads out instead of all landing on the one
  backend that looked idle (``reuse_budget`` may be changed between picks: the prequal policy ties it to the ratio
  of picks to probes);
- when the pool is full, the oldest probe makes room;
- ``choose`` may ask for at least ``min_choice`` candidates: HCL over a single leftover probe is no choice at all
  (it would send every call to whichever backend was probed last), the caller then decides by other means.

Registered weights (``weights.Capacity``; the caller passes them when they differ): a probe's RIF counts per unit of
capacity (``Probe.units``), in the hot threshold's history and in the hot test, so a heavy backend is not hot for
carrying its share; and the cold choice is weighted P2C: two cold candidates drawn by weight, with replacement, the
lower latency taken (``p2c.prefer``). Lowest latency among all the cold ones would hand every idle pick to whichever
backend reported a hair faster, whatever the weights; the weighted draw gives each its weight's share when they
report alike.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from .p2c import WeightedDraw, prefer

Clock = Callable[[], float]


@dataclass(slots=True)
class Probe:
    """One backend's load report as a probe received it (latency in seconds; ``received`` on the policy clock)."""

    address: str
    inflight: float
    latency: float
    received: float
    uses: int = 0
    own: int = 0  # this client's calls in flight at the backend when the report came
    units: float = 1.0  # the backend's capacity, weight / mean weight (weights differ): its RIF counts per unit


class ProbePool:
    """A bounded pool of recent probes; not thread-safe (the prequal policy holds its lock around every call)."""

    def __init__(
        self,
        *,
        size: int = 16,
        max_age: float = 1.0,
        reuse_budget: int = 2,
        rif_quantile: float = 0.84,
        history: int = 64,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        if size < 1 or max_age <= 0 or reuse_budget < 1 or history < 1 or not 0.0 < rif_quantile <= 1.0:
            raise ValueError("probe pool: size, history, reuse_budget >= 1, max_age > 0, 0 < rif_quantile <= 1")
        self.size = size
        self.max_age = max_age
        self.reuse_budget = reuse_budget
        self.rif_quantile = rif_quantile
        self._clock = clock
        self._rng = rng
        self._probes: dict[str, Probe] = {}  # address -> latest probe; insertion order = age order
        self._recent_rif: deque[float] = deque(maxlen=history)  # RIFs as reported, for the hot threshold
        self._hot_above = math.inf  # recomputed when a probe arrives (probes are rarer than picks)

    def __len__(self) -> int:
        return len(self._probes)

    def probes(self) -> list[Probe]:
        """The probes held now, oldest first (a copy of the list; the probes themselves are live)."""
        return list(self._probes.values())

    def add(self, probe: Probe) -> None:
        """Keep ``probe``, replacing an older probe of the same backend, evicting the oldest when full."""
        self._probes.pop(probe.address, None)
        self._recent_rif.append(probe.inflight / probe.units)
        self._hot_above = _quantile(sorted(self._recent_rif), self.rif_quantile)
        while len(self._probes) >= self.size:
            del self._probes[next(iter(self._probes))]
        self._probes[probe.address] = probe

    def fastest(self) -> float | None:
        """The lowest latency estimate among the fresh probes (None when there is none)."""
        self.expire()
        return min((p.latency for p in self._probes.values()), default=None)

    def discard(self, address: str) -> None:
        """Forget the probe of ``address`` (it left the READY set or its probe failed)."""
        self._probes.pop(address, None)

    def expire(self) -> None:
        """Drop probes older than ``max_age``. Probes are held oldest first, so this stops at the first young one."""
        horizon = self._clock() - self.max_age
        while self._probes:
            first = next(iter(self._probes.values()))
            if first.received >= horizon:
                break
            del self._probes[first.address]

    def choose(self, usable: Container[str], own: Callable[[str], int] | None = None, min_choice: int = 1,
               hot_choice: bool = True, weights: Mapping[str, int] | None = None) -> Probe | None:
        """The HCL choice among the fresh probes of ``usable`` backends; None when fewer than ``min_choice``, or,
        with ``hot_choice`` False, when every candidate is hot or when a hot one promises a lower latency than the
        best cold one (the caller then decides by other means). A cold backend slower than a loaded one is cold
        *because* it is slow (a slow or cold-starting server: the few calls it gets keep its RIF low); HCL would
        send it every pick its RIF stays low for, and one call in a hundred there is the p99.

        ``own(address)``: this client's calls in flight there now (see the module doc). ``weights``: address ->
        registered weight when the weights differ (the cold choice is then weighted P2C, see the module doc).
        Counts the use: the chosen probe leaves the pool once its budget is spent.
        """
        self.expire()
        candidates = [p for p in self._probes.values() if p.address in usable]
        if not candidates or len(candidates) < min_choice:
            return None
        rif: dict[str, float] = {}
        latency: dict[str, float] = {}
        for p in candidates:
            r = p.inflight + p.uses if own is None else max(float(mine := own(p.address)), p.inflight - p.own + mine)
            rif[p.address] = r
            # weighted: scaled both ways (a report taken while our now-ended calls were there overstates the
            # latency of the next call; the backends a weighted choice favours carry our calls more often, so
            # their reports would look slower); unweighted: only up, as always (the same picks as before)
            rescale = r > p.inflight or (weights is not None and r < p.inflight)
            latency[p.address] = p.latency * (r + 1) / (p.inflight + 1) if rescale else p.latency
        cold = [p for p in candidates if rif[p.address] / p.units <= self._hot_above]
        if cold and weights is not None:
            draws = WeightedDraw([weights[p.address] for p in cold])
            first, second = cold[draws.draw(self._rng)], cold[draws.draw(self._rng)]
            best = second if prefer(self._rng, latency[first.address], latency[second.address]) else first
        elif cold:
            best = _lowest(cold, lambda p: latency[p.address], self._rng)
            if not hot_choice and len(cold) < len(candidates) and latency[best.address] > min(
                    latency[p.address] for p in candidates if rif[p.address] / p.units > self._hot_above):
                return None  # the pool contradicts itself: the caller decides (see the method doc)
        elif hot_choice:
            best = _lowest(candidates, lambda p: rif[p.address], self._rng)
        else:
            return None
        best.uses += 1
        if best.uses >= self.reuse_budget:
            del self._probes[best.address]
        return best


def _quantile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of a non-empty sorted list (nearest rank, as Prequal's RIF threshold)."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _lowest(probes: list[Probe], key: Callable[[Probe], float], rng: random.Random) -> Probe:
    low = min(key(p) for p in probes)
    tied = [p for p in probes if key(p) == low]
    return tied[0] if len(tied) == 1 else rng.choice(tied)
