"""peak_ewma: best of k (4; 2 is P2C) over a peak-sensitive EWMA of latency x (calls in flight + 1).

The load metric of Finagle's and Linkerd's (tower's) Peak EWMA balancers, client-side only, so it works with any
backend. What it guarantees, its fields and why four choices: docs/policies.md ("peak_ewma", "The load sweep").
What the code keeps per backend and why:

- a sample above the estimate replaces it at once (the "peak": avoided from its first slow reply); a lower one is
  averaged in with weight ``1 - w``, ``w = exp(-elapsed / decayTime)``; between samples the estimate decays
  towards zero by the same ``w`` when read (the stored value changes only on samples), so a backend that lost
  its traffic for being slow is tried again after a while;
- ``load = estimate * (in flight + 1)``, the in-flight count per unit of capacity when registered weights differ
  (weighted P2C, ``weights.Capacity``); an estimate decayed to zero, or never measured, with calls in flight
  counts as ``PENALTY + in flight`` (Finagle's rule): a new backend gets one call at once, not a flood, and its
  first reply sets its estimate outright (averaging a guess in over the 10 s window kept 4 ms backends looking
  ~30 ms for seconds, and a 25 ms backend looked the fastest);
- a backend never sampled starts at ``defaultRtt`` or its sampled peers' median when lower: at 30 ms among peers
  at 5 ms it would starve for the ~7 s its estimate takes to decay below theirs; never above ``defaultRtt``, so
  failing or slow peers do not make a newcomer look slow;
- failures (``failure``): a fading penalty in in-flight units (times the larger latency of the pair compared)
  instead of a latency sample (a backend that fails fast must not look fast; a request error's latency counts
  only as a peak); a call outstanding since the backend's last answer is a lower bound of its estimate (a black
  hole looks slower every second); cancelled calls and deadlines below the backend's usual latency are not
  sampled; a pushback loses every comparison for its duration.

A pick draws ``choiceCount`` distinct backends (all of them when there are no more) and takes the lowest load in
draw order; when the weights differ, two drawn by weight with replacement (``weights.Capacity``: one drawn twice
is taken unless a call failed there within ``decayTime``). ``prequal`` builds on this policy's statistics
(``take``, ``stats_of``) and keeps no copy. A statistics line is logged once a minute on the policy clock, from a
pick (no timer thread). Thread safety: one lock per policy guards the in-flight counts and samples; a pick reads
its draws' state under it.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..durations import parse_config_duration
from ..metrics import BackendLoad
from ..types import Backend
from . import concurrency_limit, method_costs, p2c, slow_start
from .base import DoneHook, Outcome, Picker, PickInfo, PickResult
from .config_fields import policy_config
from .failure import BackendFailures, Verdict, prefer_second
from .load_aware import LoadAwarePolicy
from .weights import CapacityPicker, no_backend

log = logging.getLogger("waypost.balancer.peak_ewma")

DEFAULT_DECAY_TIME = 10.0  # seconds: the window latency is observed over (Linkerd's default)
DEFAULT_RTT = 0.030  # seconds: the estimate of a backend never sampled (Linkerd's default)
PENALTY = 1e6  # load of a backend whose estimate decayed to zero while it has calls in flight
DURATION_FIELDS = {"decayTime", "defaultRtt"}
#: the fields a policy built on this one (prequal) passes on to it
FALLBACK_FIELDS = DURATION_FIELDS | {slow_start.FIELD, "choiceCount"}
CONFIG_FIELDS = FALLBACK_FIELDS | {method_costs.FIELD, concurrency_limit.FIELD}
#: backends compared per pick when the weights are equal (best of k). Two (P2C) caps a backend's share near 2 / n:
#: 16 backends of 8 slots among 50 with 2 or 4 could get at most 54 % of the calls, their capacity is 56 %
DEFAULT_CHOICE_COUNT = 4
LOG_INTERVAL = 60.0  # seconds between statistics lines


class PeakEwmaStats:
    """What peak_ewma knows about one backend."""

    __slots__ = ("address", "born", "cost", "failed_at", "failures", "inflight", "limit", "requests", "sampled",
                 "stamp")

    def __init__(self, address: str, now: float, start_rtt: float, born: float = slow_start.NOT_RAMPING,
                 limit: concurrency_limit.BackendLimit | None = None) -> None:
        self.address = address
        self.born = born  # when its slow start began
        self.cost = start_rtt  # seconds, at time ``stamp``
        self.stamp = now
        self.inflight = 0  # calls in flight, each counted at its method's cost
        self.requests = 0  # picks since the last statistics line
        self.sampled = False  # True once a call has ended here
        self.failed_at = -math.inf  # clock of the last failed call here
        self.failures = BackendFailures()
        self.limit = limit  # its concurrency limit (``concurrencyLimit``; None: off)

    def estimate(self, now: float, decay: float) -> float:
        """The latency estimate at ``now``: decayed towards zero since the last sample."""
        return self.cost * math.exp(-max(0.0, now - self.stamp) / decay)

    def latency(self, now: float, decay: float) -> float:
        """The estimate, at least the age of a call outstanding since the last answer (``failure``: silence)."""
        return max(self.estimate(now, decay), self.failures.silence(now))

    def load(self, now: float, decay: float, units: float | None = None, ref: float = 0.0,
             latency: float | None = None) -> float:
        """``latency * (in flight + 1) + max(latency, ref) * failure penalty``; with ``units`` (weights differ:
        ``weights.Capacity``) the calls in flight are counted per unit of capacity, ``in flight / units``. ``ref``:
        the other candidate's latency (a penalty counts at the pair's larger latency: a failing backend's own
        estimate fades while it gets no calls, its penalty must not fade with it). ``latency``: ``self.latency(now,
        decay)`` when the caller has it already (a pick's comparisons read it once per candidate)."""
        queue = self.inflight if units is None else self.inflight / units
        penalty = self.failures.penalty(now)
        if not self.sampled:  # never measured: free while idle (measured at once), then one call at a time
            return (PENALTY + queue if self.inflight else 0.0) + penalty * ref
        est = self.latency(now, decay) if latency is None else latency
        if est == 0.0 and self.inflight:
            return PENALTY + queue + penalty * ref
        return est * (queue + 1) + max(est, ref) * penalty

    def observe(self, rtt: float, now: float, decay: float) -> None:
        if rtt > self.cost or not self.sampled:  # a peak, or the first measurement: it replaces a mere guess
            self.sampled = True
            self.cost = rtt
        else:
            w = math.exp(-max(0.0, now - self.stamp) / decay)
            self.cost = self.cost * w + rtt * (1.0 - w)
        self.stamp = now


class PeakEwmaPicker(CapacityPicker["PeakEwmaPolicy", PeakEwmaStats]):

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The backends picked among (drained ones left out), in the order ``take`` indexes them."""
        return self._backends

    @property
    def drained(self) -> int:
        """How many READY backends were left out as drained (weight 0)."""
        return self._drained

    def _lighter(self, j: int, i: int, now: float, decay: float) -> bool:
        """Whether backend ``j``'s load is below ``i``'s (per unit of capacity when the weights differ); a backend
        that pushed back loses to one that did not (``failure``)."""
        si, sj = self._stats[i], self._stats[j]
        pushed = prefer_second(si.failures, sj.failures, now)
        if pushed is not None:
            return pushed
        li, lj = si.latency(now, decay), sj.latency(now, decay)
        ref = max(li, lj)
        u = self._units
        if u is None:
            return sj.load(now, decay, ref=ref, latency=lj) < si.load(now, decay, ref=ref, latency=li)
        return p2c.prefer(self._policy.rng, si.load(now, decay, u[i], ref, li), sj.load(now, decay, u[j], ref, lj))

    def _better(self, i: int, j: int, now: float, decay: float) -> int:
        """The one of candidates ``i`` and ``j`` (drawn in that order) a pick takes."""
        si, sj = self._stats[i], self._stats[j]
        only = self._policy.slow_start.only_admitted(si.born, sj.born, now)
        if only is not None:  # one of the pair is ramping and not admitted: the other one
            return j if only else i
        return j if i != j and self._lighter(j, i, now, decay) else i

    def _under_limit(self, now: float, decay: float) -> int:
        """P2C among the backends ``concurrency_limit.room`` leaves (the choice fell on one at its limit); raises
        ``AtLimit`` when it leaves none (the call waits)."""
        stats = self._stats
        open_ = concurrency_limit.room([st.limit for st in stats], lambda k: self._troubled(k, now, decay),
                                       lambda k: stats[k].failures.trial_due(now), "peak_ewma")
        if len(open_) == 1:
            return open_[0]
        a, b = p2c.pair(self._policy.rng, len(open_))
        i, j = open_[a], open_[b]
        return j if self._lighter(j, i, now, decay) else i

    def _troubled(self, k: int, now: float, decay: float) -> bool:
        st = self._stats[k]
        return st.failures.troubled(now, st.estimate(now, decay) if st.sampled else None)

    def _weighted_pair(self, now: float, decay: float) -> tuple[int, int]:
        """Weighted P2C's candidates (``weights.Capacity``): two draws by weight; a backend drawn twice where a call
        failed within ``decayTime`` is compared with one drawn from the others (its weight buys it no pick)."""
        draws = self._draws
        assert draws is not None
        rng = self._policy.rng
        i, j = draws.pair(rng)
        if i == j and now - self._stats[i].failed_at <= decay:
            j = draws.other(rng, i)
        return i, j

    def pick(self, info: PickInfo) -> PickResult:
        costs = self._policy.costs
        result = self.draw(costs.get(info.method, 1) if costs else 1)
        self._policy.maybe_log()
        return result

    def draw(self, cost: int = 1) -> PickResult:
        """The draw's choice, counted in flight, without the statistics line: a policy built on this one may call it
        under its own lock, which the line's extra text (``log_extra``) takes; it calls ``maybe_log`` after."""
        n = len(self._stats)
        if n == 0:
            raise no_backend(self._policy.name, self._drained)
        policy = self._policy
        i = 0
        now = policy.clock()
        with policy.lock:
            if n > 1:
                decay = policy.decay
                k = policy.choice_count
                if self._draws is not None:
                    i, j = self._weighted_pair(now, decay)
                    others = [j]
                elif k == 2 or n == 2:
                    i, j = p2c.pair(policy.rng, n)
                    others = [j]
                else:  # best of k: k distinct backends (all of them when there are no more)
                    i, *others = p2c.distinct(policy.rng, n, k)
                for j in others:
                    i = self._better(i, j, now, decay)
            chosen = self._stats[i]
            limit = chosen.limit
            if limit is not None and limit.full():  # the better of those with room, or wait (``concurrency_limit``)
                i = self._under_limit(now, policy.decay)
                chosen = self._stats[i]
                limit = chosen.limit
            sent_with = 0 if limit is None else limit.acquire()
            chosen.inflight += cost
            chosen.requests += 1
            chosen.failures.picked(now)
        return PickResult(self._backends[i], policy._done_hook(chosen, cost, sent_with))

    def take(self, i: int) -> PickResult:
        """Pick backend ``i`` (of the build's backends, deduplicated, in order) chosen by a policy built on this
        one: count the call in these statistics and return the hook that samples its latency."""
        policy = self._policy
        chosen = self._stats[i]
        now = policy.clock()
        with policy.lock:
            chosen.inflight += 1
            chosen.requests += 1
            chosen.failures.picked(now)
        return PickResult(self._backends[i], policy._done_hook(chosen))


class PeakEwmaPolicy(LoadAwarePolicy[PeakEwmaStats]):
    """Best of ``choiceCount`` over peak EWMA latency x (in flight + 1); statistics kept across rebuilds."""

    name = "peak_ewma"
    log = log

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.decay = float(self.config.get("decayTime", DEFAULT_DECAY_TIME))
        self.default_rtt = float(self.config.get("defaultRtt", DEFAULT_RTT))
        self.costs: dict[str, int] = dict(self.config.get(method_costs.FIELD, {}))
        self.choice_count = int(self.config.get("choiceCount", DEFAULT_CHOICE_COUNT))
        self._start_rtt = self.default_rtt  # a new backend's estimate; set by each rebuild from its peers
        self._log_stamp = self.clock()
        #: the statistics line's name, and more text per address (set by a policy built on this one)
        self.log_name = self.name
        self.log_extra: Callable[[], dict[str, str]] | None = None

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, CONFIG_FIELDS)
        for key in DURATION_FIELDS & set(cfg):
            cfg[key] = parse_config_duration(cfg[key], f"{path}.{key}", positive=True)
        slow_start.parse_window(cfg, path)
        method_costs.parse_costs(cfg, path)
        concurrency_limit.parse_limit(cfg, path)
        p2c.parse_choice_count(cfg, path)
        return cfg

    def build(self, backends: Sequence[Backend]) -> Picker:
        return PeakEwmaPicker(self, *self._rebuild(backends))

    def _new_stats(self, backend: Backend) -> PeakEwmaStats:
        limit = None if self.limits is None else concurrency_limit.BackendLimit(self.limits)
        return PeakEwmaStats(backend.address, self.clock(), self._start_rtt, self.slow_start.born(self.clock()),
                             limit)

    def _on_rebuild(self, now: float) -> None:
        # a new backend starts at its sampled peers' median (capped by defaultRtt), not at defaultRtt itself
        peers = sorted(st.estimate(now, self.decay) for _, st in self._stats.items() if st.sampled)
        self._start_rtt = min(self.default_rtt, statistics.median(peers)) if peers else self.default_rtt

    def _done_hook(self, st: PeakEwmaStats, cost: int = 1, sent_with: int = 0) -> DoneHook:
        """The hook that counts the call out and samples it; ``sent_with``: ``BackendLimit.acquire``'s count."""
        def done(outcome: Outcome) -> None:
            rtt = max(0.0, outcome.latency)
            now = self.clock()
            freed = False
            with self.lock:
                st.inflight -= cost
                verdict = st.failures.ended(outcome, now, st.inflight)
                if verdict is Verdict.ANSWER:
                    st.observe(rtt, now, self.decay)
                elif verdict is Verdict.FAILURE:  # its penalty says enough; its latency, fast or slow, is not a reply's
                    st.failed_at = now
                elif verdict is Verdict.REJECTED and st.sampled and rtt > st.cost:
                    st.observe(rtt, now, self.decay)  # a request error may say "slow", never "fast"
                if st.limit is not None and sent_with:
                    freed = st.limit.release(verdict, sent_with)
            if freed:
                self._freed()

        return done

    def admits(self, address: str) -> bool:
        """Whether ``address`` takes part in a choice now (``slow_start``: always, unless it is ramping)."""
        st = self._stats.get(address)
        if st is None or not self.slow_start.window:
            return True
        return self.slow_start.admits(st.born, self.clock())

    def stats_of(self, address: str) -> tuple[int, float] | None:
        """(calls in flight from this client, latency estimate now) of ``address``; None when unknown."""
        now = self.clock()
        with self.lock:
            st = self._stats.get(address)
            return None if st is None else (st.inflight, st.estimate(now, self.decay))

    def troubled(self, address: str) -> bool:
        """Whether ``address`` must not be chosen on load reports alone now: it pushed back, carries a failure
        penalty or has been silent for long (``failure.BackendFailures.troubled``)."""
        now = self.clock()
        with self.lock:
            st = self._stats.get(address)
            return st is not None and st.failures.troubled(now, st.estimate(now, self.decay) if st.sampled else None)

    def inflight_of(self, address: str) -> int:
        """This client's calls in flight at ``address`` (0 when unknown); one dict read, no lock (an int read is
        atomic; the value may be a moment old, as any load signal)."""
        st = self._stats.get(address)
        return 0 if st is None else st.inflight

    def signals(self) -> list[BackendLoad]:
        now = self.clock()
        with self.lock:
            return [BackendLoad(addr, st.inflight, st.estimate(now, self.decay)) for addr, st in self._stats.items()]

    def maybe_log(self) -> None:
        """Log the statistics line when ``LOG_INTERVAL`` has passed on the policy clock."""
        now = self.clock()
        if now - self._log_stamp < LOG_INTERVAL:
            return
        extra = self.log_extra() if self.log_extra is not None else {}
        with self.lock:
            if now - self._log_stamp < LOG_INTERVAL:  # another thread logged meanwhile
                return
            self._log_stamp = now
            parts = []
            for addr, st in self._stats.items():
                more = extra.get(addr, "")
                parts.append(f"conn: {addr}, inflight: {st.inflight}, latency: "
                             f"{st.estimate(now, self.decay) * 1000:.1f} ms, reqs: {st.requests}{more}")
                st.requests = 0
        log.info("%s - %s", self.log_name, "; ".join(parts))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """address -> {estimate (seconds, now), inflight, load} (for tests, metrics and debugging)."""
        now = self.clock()
        with self.lock:
            return {addr: {"estimate": st.estimate(now, self.decay), "inflight": st.inflight,
                           "load": st.load(now, self.decay)} for addr, st in self._stats.items()}
