"""p2c_ewma: power of two choices over an EWMA of latency, ported from go-zero (zrpc p2c_ewma).

Behaviour and constants match go-zero: each backend has a time-decayed EWMA of its latency (``lag``,
nanoseconds) and of its success (0..1000), plus its in-flight count. ``load = int(sqrt(lag + 1)) *
(inflight + 1)``. One backend: pick it. Two: compare them. More: draw two distinct backends at
random, up to ``PICK_TIMES`` times, until both are healthy (success > 500), then take the one with
the lower load -- unless the other one has not been picked for more than ``FORCE_PICK`` seconds, in
which case it is force-picked (so a backend with one bad sample is re-measured). When a call ends,
``td`` = time since that backend's previous sample, ``w = exp(-td / DECAY_TIME)`` (0 for the first
sample), ``lag = lag*w + rtt*(1-w)`` and ``success = success*w + (0 or 1000)*(1-w)``, failure being
one of ``stats.FAILURE_CODES``. A statistics line ``p2c - conn: ADDR, load: N, reqs: N; ...`` is
logged (``waypost.balancer.p2c``, INFO) when a minute has passed on the policy clock, from pick or
done (no timer thread).

Better than go-zero: the statistics live in the policy, keyed by address, so they survive picker
rebuilds for backends that stay (go-zero resets them on every address-set change). A backend seen
for the first time counts as picked at that moment, so it is force-picked a second later at the
latest if plain comparison never chooses it.

The latency sample is ``Outcome.latency`` as the channel measured it.

Registered weights (not in go-zero, which has none): when they differ, the pair is drawn by weight with
replacement (two backends included), still redrawn until both are healthy; one drawn twice is taken unless it is
unhealthy (then compared with one drawn from the others), and the loads compared count the calls in flight per
unit of capacity, ``int(sqrt(lag + 1)) * (inflight / units + 1)`` (``weights.Capacity``: idle, each backend gets
its weight's share). Equal weights (or none) change nothing: go-zero's picks exactly.

Config: none by default, which is go-zero's behaviour exactly. ``{"p2c_ewma": {"slowStartWindow": "10s"}}``
(``slow_start``; not in go-zero) ramps a backend that just appeared: it takes part in a pair's comparison
(force pick included) with a probability growing from 10 % to 1 over the window; when it is not admitted, the
other one of the pair is picked. A newcomer here has no latency yet (load 1, the lowest), so without it a cold
backend wins every pair it is drawn in until its first replies come back.

Thread safety: one ``threading.Lock`` per policy (go-zero has one per picker) guards every update;
pick and done hold it for a few arithmetic operations.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Backend
from . import p2c, slow_start
from .base import DoneHook, Outcome, Picker, PickInfo, PickResult
from .config_fields import policy_config
from .load_aware import LoadAwarePolicy
from .stats import is_failure
from .weights import CapacityPicker, no_backend

log = logging.getLogger("waypost.balancer.p2c")

DECAY_TIME = 10.0  # seconds (Finagle's default, as go-zero)
FORCE_PICK = 1.0  # seconds without a pick after which the worse of a pair is picked anyway
INIT_SUCCESS = 1000
THROTTLE_SUCCESS = INIT_SUCCESS // 2
PENALTY = 2**31 - 1  # load of a backend whose load computes to 0 (unreachable, kept from go-zero)
PICK_TIMES = 3
LOG_INTERVAL = 60.0  # seconds


class P2CStats:
    """What p2c knows about one backend."""

    __slots__ = ("address", "born", "inflight", "lag", "last", "picked", "requests", "success")

    def __init__(self, address: str, now: float, born: float = slow_start.NOT_RAMPING) -> None:
        self.address = address
        self.born = born  # when its slow start began (slowStartWindow)
        self.lag = 0  # EWMA latency, integer nanoseconds
        self.inflight = 0
        self.success = INIT_SUCCESS  # EWMA success, 0..1000
        self.requests = 0  # picks since the last statistics line
        self.last = 0.0  # time of the previous latency sample
        self.picked = now  # time of the last pick

    def healthy(self) -> bool:
        return self.success > THROTTLE_SUCCESS

    def load(self) -> int:
        load = int(math.sqrt(self.lag + 1)) * (self.inflight + 1)
        return PENALTY if load == 0 else load

    def unit_load(self, units: float) -> float:
        """``load`` with the calls in flight per unit of capacity (weights differ: ``weights.Capacity``); never
        0 (``sqrt(lag + 1) >= 1``), so no penalty case."""
        return int(math.sqrt(self.lag + 1)) * (self.inflight / units + 1)


class P2CPicker(CapacityPicker["P2CEwmaPolicy", P2CStats]):

    def pick(self, info: PickInfo) -> PickResult:
        n = len(self._stats)
        if n == 0:
            raise no_backend(P2CEwmaPolicy.name, self._drained)
        policy = self._policy
        now = policy.clock()
        with policy.lock:
            if n == 1:
                i = self._choose(now, 0, None)
            elif self._draws is not None:
                i = self._choose_weighted(now)
            elif n == 2:
                i = self._choose(now, 0, 1)
            else:
                a = b = 0
                for _ in range(PICK_TIMES):
                    a, b = p2c.pair(policy.rng, n)
                    if self._stats[a].healthy() and self._stats[b].healthy():
                        break
                i = self._choose(now, a, b)
            chosen = self._stats[i]
            chosen.inflight += 1
            chosen.requests += 1
        policy._maybe_log(now)
        return PickResult(self._backends[i], policy._done_hook(chosen))

    def _choose_weighted(self, now: float) -> int:
        """Weighted P2C (``weights.Capacity``): draws by weight, with replacement, redrawn up to ``PICK_TIMES`` times
        until both are healthy (go-zero's rule); a backend drawn twice is taken, unless it is unhealthy: it is then
        compared with one drawn from the others."""
        draws = self._draws
        assert draws is not None
        rng = self._policy.rng
        a = b = 0
        for _ in range(PICK_TIMES):
            a, b = draws.pair(rng)
            if self._stats[a].healthy() and self._stats[b].healthy():
                break
        if a == b and not self._stats[a].healthy():
            b = draws.other(rng, a)
        return self._choose(now, a, None if a == b else b)

    def _choose(self, now: float, i1: int, i2: int | None) -> int:
        s1 = self._stats[i1]
        if i2 is None:
            s1.picked = now
            return i1
        s2 = self._stats[i2]
        only = self._policy.slow_start.only_admitted(s1.born, s2.born, now)
        if only is not None:  # one of the pair is ramping and not admitted: the other one
            if only:
                i1, s1 = i2, s2
            s1.picked = now
            return i1
        u = self._units
        if (s1.load() > s2.load()) if u is None else p2c.prefer(self._policy.rng, s1.unit_load(u[i1]), s2.unit_load(u[i2])):
            i1, i2, s1, s2 = i2, i1, s2, s1
        if now - s2.picked > FORCE_PICK:
            s2.picked = now
            return i2
        s1.picked = now
        return i1


class P2CEwmaPolicy(LoadAwarePolicy[P2CStats]):
    """go-zero's P2C with time-decayed EWMA latency, statistics kept across rebuilds."""

    name = "p2c_ewma"
    log = log

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._log_stamp = self.clock()

    def _new_stats(self, backend: Backend) -> P2CStats:
        return P2CStats(backend.address, self.clock(), self.slow_start.born(self.clock()))

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, (slow_start.FIELD,), note=" (go-zero's constants are fixed)")
        slow_start.parse_window(cfg, path)
        return cfg

    def build(self, backends: Sequence[Backend]) -> Picker:
        return P2CPicker(self, *self._rebuild(backends))

    def _done_hook(self, st: P2CStats) -> DoneHook:
        def done(outcome: Outcome) -> None:
            now = self.clock()
            rtt = max(0, int(outcome.latency * 1e9))
            with self.lock:
                st.inflight -= 1
                td = max(0.0, now - st.last)
                st.last = now
                w = math.exp(-td / DECAY_TIME)
                if st.lag == 0:
                    w = 0.0
                st.lag = int(st.lag * w + rtt * (1 - w))
                target = 0 if is_failure(outcome.code) else INIT_SUCCESS
                st.success = int(st.success * w + target * (1 - w))
            self._maybe_log(now)

        return done

    def _maybe_log(self, now: float) -> None:
        if now - self._log_stamp < LOG_INTERVAL:
            return
        with self.lock:
            if now - self._log_stamp < LOG_INTERVAL:  # another thread logged meanwhile
                return
            self._log_stamp = now
            parts = []
            for st in self._stats.values():  # the backends of the latest build
                parts.append(f"conn: {st.address}, load: {st.load()}, reqs: {st.requests}")
                st.requests = 0
        log.info("p2c - %s", "; ".join(parts))

    def snapshot(self) -> dict[str, dict[str, int]]:
        """address -> {lag, inflight, success, load} (for tests, metrics and debugging)."""
        with self.lock:
            return {
                addr: {"lag": st.lag, "inflight": st.inflight, "success": st.success, "load": st.load()}
                for addr, st in self._stats.items()
            }
