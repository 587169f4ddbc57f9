"""prequal: balance on what the servers report, probed asynchronously, with hot-cold lexicographic choice.

After "Load is not what you should balance: Introducing Prequal" (Wydrowski, Kleinberg, Rumble; NSDI '24). What it
does, its fields and the measurements behind each choice: docs/policies.md ("prequal"). In this module:

- each pick asks for the server's ``waypost-server-load`` trailer (``callReports``; ``waypost.orca.call_load``):
  the done hook feeds it to the pool as a probe answer that cost no RPC;
- probes go off the call path through the channel's ``base.LoadProber``: ``probesPerPick`` credits per pick, at
  most ``maxProbeRate`` per second (a token bucket: their CPU cost), one outstanding per backend, a failed one
  pausing that backend's probes for ``PROBE_PAUSE`` seconds; of two backends drawn, the one reported on least
  recently is probed, so a small fleet's pool covers every backend;
- the pool (``prequal_pool.ProbePool``) chooses hot-cold lexicographically; peak_ewma (its very statistics: every
  call is counted there) decides whenever the pool cannot be trusted: fewer than two usable probes, no cold one,
  a hot probe faster than the best cold one (a slow backend stays cold *because* it is slow), no report within
  ``maxProbeAge``, or a probe of a backend with a failure penalty, a pushback or an overdue call (a backend that
  fails fast reports few requests in flight and must not look idle);
- backends without load reports (UNIMPLEMENTED, or no in-flight count) are not probed again while they stay and
  enter the pool with peak_ewma's view of them, so a mixed fleet is compared in one pool;
- registered weights that differ: the fallback is peak_ewma's weighted P2C, and the pool counts RIF per unit of
  capacity and draws cold candidates by weight; ``slowStartWindow`` ramps the fallback's draws and admits a ramping
  backend's probe to a pool choice with the ramp's probability.

A probe never blocks or fails a call: the pick reads the pool and peak_ewma's statistics only. Thread safety: one
lock guards the pool and the probe scheduling; probes are sent and answers received outside any pick.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..durations import parse_config_duration
from ..errors import InvalidServiceConfig
from ..metrics import BackendLoad
from ..orca import call_load
from ..types import Backend
from . import p2c, slow_start
from .base import DoneHook, LoadProber, Outcome, Picker, PickInfo, PickResult, Policy
from .config_fields import policy_config
from .peak_ewma import DURATION_FIELDS as PEAK_DURATIONS
from .peak_ewma import FALLBACK_FIELDS as PEAK_FIELDS
from .peak_ewma import PeakEwmaPicker, PeakEwmaPolicy
from .prequal_pool import Probe, ProbePool
from .stats import dedupe
from .weights import no_backend

log = logging.getLogger("waypost.balancer.prequal")

DEFAULT_PROBES_PER_PICK = 1.0
#: probes per second per channel. Measured with ``bench/load_sweep.py --probe-cost`` (2-core machine, shared): a
#: probe through a sync backend channel costs ~520 us of client CPU (``.future()`` and its done callback on grpc's
#: completion thread), a balanced call ~320 us; 3 % of the client CPU at 1,000 calls/s is ~9.7 ms/s, i.e. ~18
#: probes/s. 16 keeps a margin; the automatic reuse budget stretches each probe over the picks in between.
DEFAULT_MAX_PROBE_RATE = 16.0
DEFAULT_POOL_SIZE = 16
DEFAULT_MAX_AGE = 1.0  # seconds
#: above the paper's 0.84: RIF is not per capacity, and at 0.84 the largest backends of a heterogeneous fleet (more calls
#: in flight for being larger) were hot and starved (bench/simulate.py sweep: many_clients, hetero_cap)
DEFAULT_HOT_QUANTILE = 0.95
#: ... but when registered weights differ, RIF is counted per unit of capacity (``prequal_pool``): the paper's value
WEIGHTED_HOT_QUANTILE = 0.84
DEFAULT_PROBE_TIMEOUT = 0.25  # seconds
MIN_AUTO_REUSE = 2  # the automatic reuse budget's floor (a probe is worth at least two picks)
FIRST_AUTO_REUSE = 16  # ... before the first window is counted
MAX_AUTO_REUSE = 256  # ... and ceiling (our own calls are counted in a probe's RIF, so reuse does not herd us)
REUSE_FACTOR = 4.0  # automatic budget = this x picks per probe: a probe outlives its share until fresher ones come
PROBE_PAUSE = 1.0  # seconds without probes to a backend whose probe failed
RATE_WINDOW = 1.0  # seconds: picks and probes are counted over this window for the automatic reuse budget

NUMBER_FIELDS = {"probesPerPick": (0.0, 100.0), "maxProbeRate": (0.1, 1e6), "hotQuantile": (0.01, 1.0)}
INT_FIELDS = {"poolSize": (1, 1024), "reuseBudget": (1, 1000)}
DURATION_FIELDS = {"maxProbeAge", "probeTimeout"}
BOOL_FIELDS = {"callReports"}
CONFIG_FIELDS = set(NUMBER_FIELDS) | set(INT_FIELDS) | DURATION_FIELDS | BOOL_FIELDS | PEAK_FIELDS


class PrequalPicker(Picker):
    def __init__(self, policy: PrequalPolicy, backends: Sequence[Backend], fallback: PeakEwmaPicker) -> None:
        self._policy = policy
        self._fallback = fallback
        self._index = {b.address: i for i, b in enumerate(backends)}
        self._addresses = tuple(self._index)

    def pick(self, info: PickInfo) -> PickResult:
        if not self._addresses:
            raise no_backend(PrequalPolicy.name, self._fallback.drained)
        policy = self._policy
        result, targets = policy._choose(self._index, self._addresses, self._fallback)
        policy.fallback.maybe_log()  # outside our lock: the line's extra text takes it
        if targets:
            policy._send(targets)
        return result


class PrequalPolicy(Policy):
    """HCL over asynchronously probed server load reports, peak_ewma when no probe is usable."""

    name = "prequal"
    wants_load_reports = True

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        cfg = self.config
        self.probes_per_pick = float(cfg.get("probesPerPick", DEFAULT_PROBES_PER_PICK))
        self.max_probe_rate = float(cfg.get("maxProbeRate", DEFAULT_MAX_PROBE_RATE))
        self.probe_timeout = float(cfg.get("probeTimeout", DEFAULT_PROBE_TIMEOUT))
        self.call_reports = bool(cfg.get("callReports", True))
        self._auto_reuse = "reuseBudget" not in cfg
        self.fallback = PeakEwmaPolicy({k: cfg[k] for k in PEAK_FIELDS & set(cfg)}, clock=self.clock, rng=self.rng)
        self.fallback.log_name, self.fallback.log_extra = self.name, self._log_extra
        self._pool = ProbePool(size=int(cfg.get("poolSize", DEFAULT_POOL_SIZE)),
                               max_age=float(cfg.get("maxProbeAge", DEFAULT_MAX_AGE)),
                               reuse_budget=int(cfg.get("reuseBudget", FIRST_AUTO_REUSE)),
                               rif_quantile=float(cfg.get("hotQuantile", DEFAULT_HOT_QUANTILE)),
                               clock=self.clock, rng=self.rng)
        self._lock = threading.Lock()
        self._prober: LoadProber | None = None
        self._ready: frozenset[str] = frozenset()
        # address -> (registered weight, units) of the READY backends when their weights differ (weights.Capacity)
        self._capacities: dict[str, tuple[int, float]] | None = None
        self._weights: dict[str, int] | None = None
        self._no_reports: set[str] = set()  # answered UNIMPLEMENTED (or no in-flight count): not probed again
        # address -> (when its probe was sent, this client's calls in flight there then: the report cannot include
        # calls started after it was asked for)
        self._outstanding: dict[str, tuple[float, int]] = {}
        self._paused: dict[str, float] = {}  # address -> no probes before this time (its probe failed)
        # address -> (RIF, latency, received, this client's calls in flight there that the RIF may include)
        self._last: dict[str, tuple[float, float | None, float, int]] = {}
        self._credit = 0.0
        now = self.clock()
        self._reported = -math.inf  # when a server last reported its load (a probe's answer or a call's trailer)
        self._tokens = 1.0
        self._token_stamp = now
        self._window_start = now
        self._window_picks = 0
        self._window_probes = 0
        self.probes_sent = 0
        self.probe_picks = 0  # picks decided by a probe (the rest fell back to peak_ewma)

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, CONFIG_FIELDS)
        for key, (lo, hi) in NUMBER_FIELDS.items():
            if key in cfg:
                cfg[key] = _number(cfg[key], f"{path}.{key}", lo, hi)
        for key, (ilo, ihi) in INT_FIELDS.items():
            if key in cfg:
                cfg[key] = _integer(cfg[key], f"{path}.{key}", ilo, ihi)
        for key in BOOL_FIELDS & set(cfg):
            if not isinstance(cfg[key], bool):
                raise InvalidServiceConfig(f"{path}.{key}: expected true or false, got {cfg[key]!r}")
        for key in (DURATION_FIELDS | PEAK_DURATIONS) & set(cfg):
            cfg[key] = parse_config_duration(cfg[key], f"{path}.{key}", positive=True)
        slow_start.parse_window(cfg, path)
        p2c.parse_choice_count(cfg, path)
        return cfg

    # ---- the channel's side --------------------------------------------------------------------------

    def attach_prober(self, prober: LoadProber) -> None:
        self._prober = prober

    def build(self, backends: Sequence[Backend]) -> Picker:
        fallback = self.fallback.build(dedupe(backends))
        assert isinstance(fallback, PeakEwmaPicker)
        # the fallback's backends: drained ones (weight 0) left out, in the order its ``take`` indexes them
        backends = fallback.backends
        ready = frozenset(b.address for b in backends)
        capacities = fallback.capacities()
        with self._lock:
            self._ready = ready
            self._capacities = capacities
            if "hotQuantile" not in self.config:
                self._pool.rif_quantile = DEFAULT_HOT_QUANTILE if capacities is None else WEIGHTED_HOT_QUANTILE
            self._weights = None if capacities is None else {a: w for a, (w, _) in capacities.items()}
            for gone in [a for a in self._last if a not in ready]:
                self._pool.discard(gone)
                del self._last[gone]
            # a backend that left and comes back is asked again (it may have been upgraded meanwhile)
            self._no_reports &= ready
            self._outstanding = {a: o for a, o in self._outstanding.items() if a in ready}
            self._paused = {a: t for a, t in self._paused.items() if a in ready}
        return PrequalPicker(self, backends, fallback)

    def on_probe(self, address: str, in_flight: int, latency: float | None) -> None:
        self._record(address, in_flight, latency, probed=True)

    def on_call_report(self, address: str, in_flight: int, latency: float | None) -> None:
        """The server's load as one of our calls there ended (``call_load``: its trailer), our call no longer
        counted in either side: a probe's answer that cost no RPC."""
        self._record(address, in_flight, latency, probed=False)

    def _record(self, address: str, in_flight: int, latency: float | None, probed: bool) -> None:
        now = self.clock()
        view = self.fallback.stats_of(address)
        with self._lock:
            asked = self._outstanding.pop(address, None) if probed else None
            if not probed:
                self._window_probes += 1  # a report per call: the reuse budget shrinks to match
            if address not in self._ready or view is None:
                return  # a late answer from a backend that left
            self._reported = now
            if latency is None:
                # No call has ended there since the server started (it just joined): as fast as the fastest
                # fresh probe, so that it is tried and measured. HCL takes the lowest latency, so anything
                # slower (this client's estimate of a backend it never called) would keep it out of the pool's
                # choices; our calls there count in its RIF at once and scale its latency, so it gets its share,
                # not every call, before its next report carries a real estimate.
                fastest = self._pool.fastest()
                lat = view[1] if fastest is None else min(fastest, view[1])
            else:
                lat = max(0.0, latency)
            own = view[0] if asked is None else min(view[0], asked[1])
            self._pool.add(Probe(address, float(in_flight), lat, now, own=own, units=self._units_of(address)))
            self._last[address] = (float(in_flight), latency, now, own)

    def on_probe_failed(self, address: str, unsupported: bool) -> None:
        now = self.clock()
        with self._lock:
            self._outstanding.pop(address, None)
            self._pool.discard(address)
            self._last.pop(address, None)
            if address not in self._ready:
                return
            if unsupported:
                if address not in self._no_reports:
                    log.info("prequal: %s has no load reports; using this client's view of it (peak_ewma)", address)
                self._no_reports.add(address)
            else:
                self._paused[address] = now + PROBE_PAUSE

    # ---- the pick ------------------------------------------------------------------------------------

    def _choose(self, index: dict[str, int], addresses: Sequence[str], fallback: PeakEwmaPicker
                ) -> tuple[PickResult, list[str]]:
        """The pick (HCL from the pool, else peak_ewma's) and the probe targets this pick earned. The call is
        counted in flight before the probes are scheduled: a probe records this client's calls in flight when
        it is asked, and this call may reach the server before the probe does."""
        now = self.clock()
        with self._lock:
            # all hot: peak_ewma decides (see the module doc)
            usable: Mapping[str, int] | _Admitted = index
            if self.fallback.slow_start.window:
                usable = _Admitted(index, self.fallback.admits)
            probe = None
            if now - self._reported <= self._pool.max_age:  # no server reported its load lately: peak_ewma
                probe = self._pool.choose(usable, self.fallback.inflight_of, min(2, len(addresses)),
                                          hot_choice=False, weights=self._weights)
            if probe is not None and not self.fallback.troubled(probe.address):  # failures: peak_ewma decides
                self.probe_picks += 1
                # counted under our lock, so the next pick's HCL sees this call in flight
                result = fallback.take(index[probe.address])
            else:
                result = fallback.draw()
            targets = self._schedule(now, addresses)
        if self.call_reports:
            # replace, not a new PickResult: whatever else peak_ewma's result carries stays
            result = replace(result, done=self._report_hook(result.backend.address, result.done), wants_trailers=True)
        return result, targets

    def _report_hook(self, address: str, done: DoneHook) -> DoneHook:
        """``done`` (peak_ewma's statistics), then the server's load from the call's trailer (``call_load``)."""
        def report(outcome: Outcome) -> None:
            done(outcome)
            load = call_load.decode(outcome.trailing_metadata)
            if load is not None:
                self.on_call_report(address, *load)

        return report

    def _schedule(self, now: float, addresses: Sequence[str]) -> list[str]:
        # Caller holds _lock. Credits from the call rate, tokens from the rate cap; one probe per credit and token.
        self._window_picks += 1
        if now - self._window_start >= RATE_WINDOW:
            self._retune(now)
        burst = max(1.0, self.max_probe_rate * 0.05)
        self._tokens = min(burst, self._tokens + (now - self._token_stamp) * self.max_probe_rate)
        self._token_stamp = now
        self._credit = min(burst, self._credit + self.probes_per_pick)
        targets: list[str] = []
        while self._credit >= 1.0 and self._tokens >= 1.0:
            address = self._draw(now, addresses, targets)
            if address is None:
                break
            self._credit -= 1.0
            if address in self._no_reports:
                self._add_local_view(address, now)  # no RPC: no token spent
                continue
            self._tokens -= 1.0
            self._outstanding[address] = (now, self.fallback.inflight_of(address))
            targets.append(address)
        return targets

    def _draw(self, now: float, addresses: Sequence[str], taken: list[str]) -> str | None:
        """A READY backend that may be probed now: of two drawn at random, the one whose last report is older (a
        small fleet's pool then holds every backend, not some twice as often as others). None after four draws."""
        found: str | None = None
        for _ in range(4):
            address = addresses[self.rng.randrange(len(addresses))]
            sent = self._outstanding.get(address)
            if sent is not None and now - sent[0] < 2 * self.probe_timeout:
                continue  # one outstanding probe per backend (one lost answer blocks it for two timeouts)
            if self._paused.get(address, -math.inf) > now or address in taken or address == found:
                continue
            if found is None:
                found = address
                continue
            return address if self._reported_at(address) < self._reported_at(found) else found
        return found

    def _reported_at(self, address: str) -> float:
        last = self._last.get(address)
        return -math.inf if last is None else last[2]

    def _add_local_view(self, address: str, now: float) -> None:
        view = self.fallback.stats_of(address)
        if view is not None:
            self._pool.add(Probe(address, float(view[0]), view[1], now, own=view[0], units=self._units_of(address)))

    def _units_of(self, address: str) -> float:
        """The capacity of ``address`` in units of the mean weight (1 when the weights are equal). Caller holds
        _lock."""
        capacities = self._capacities
        entry = None if capacities is None else capacities.get(address)
        return 1.0 if entry is None else entry[1]

    def _retune(self, now: float) -> None:
        """The automatic reuse budget: a probe may serve as many picks as there were picks per probe lately."""
        if self._auto_reuse:
            per_probe = self._window_picks / max(1, self._window_probes)
            self._pool.reuse_budget = max(MIN_AUTO_REUSE, min(MAX_AUTO_REUSE, math.ceil(REUSE_FACTOR * per_probe)))
        self._window_start, self._window_picks, self._window_probes = now, 0, 0

    def _send(self, targets: list[str]) -> None:
        """Hand the probes to the channel (outside the lock; the prober returns at once)."""
        prober = self._prober
        for address in targets:
            try:
                sent = prober is not None and prober.probe(address)
            except Exception:  # a probe must never fail the call that earned it
                log.exception("prequal: probing %s failed", address)
                sent = False
            with self._lock:
                if sent:
                    self.probes_sent += 1
                    self._window_probes += 1
                elif self._outstanding.get(address) is not None:
                    del self._outstanding[address]

    # ---- introspection -------------------------------------------------------------------------------

    @property
    def reuse_budget(self) -> int:
        return self._pool.reuse_budget

    def pool(self) -> list[Probe]:
        """The probes held now, oldest first (copies; for tests and debugging)."""
        with self._lock:
            return [Probe(p.address, p.inflight, p.latency, p.received, p.uses, p.own, p.units)
                    for p in self._pool.probes()]

    def without_reports(self) -> set[str]:
        with self._lock:
            return set(self._no_reports)

    def signals(self) -> list[BackendLoad]:
        """Per backend: the server's RIF and latency from its last report while fresh, else peak_ewma's view. The
        RIF has this client's part brought up to date, as the pool does (``reported - ours then + ours now``)."""
        now = self.clock()
        local = {s.address: s for s in self.fallback.signals()}
        with self._lock:
            last = dict(self._last)
        out = []
        for address, sig in local.items():
            rep = last.get(address)
            if rep is not None and now - rep[2] <= self._pool.max_age:
                rif = max(sig.in_flight, rep[0] - rep[3] + sig.in_flight)
                out.append(BackendLoad(address, rif, sig.latency if rep[1] is None else rep[1], now - rep[2]))
            else:
                out.append(BackendLoad(address, sig.in_flight, sig.latency, None if rep is None else now - rep[2]))
        return out

    def _log_extra(self) -> dict[str, str]:
        """Each backend's last report and its age, for peak_ewma's statistics line (named prequal here)."""
        now = self.clock()
        with self._lock:
            extra = {a: f", reported rif: {r[0]:g}, reported latency: "
                        f"{'-' if r[1] is None else f'{r[1] * 1000:.1f} ms'}, probe age: {(now - r[2]) * 1000:.0f} ms"
                     for a, r in self._last.items()}
            extra.update({a: ", no load reports" for a in self._no_reports})
        return extra


class _Admitted:
    """The picker's backends as a pool choice's candidates, a ramping one (``slow_start``) with its probability."""

    __slots__ = ("_admits", "_index")

    def __init__(self, index: Mapping[str, int], admits: Callable[[str], bool]) -> None:
        self._index = index
        self._admits = admits

    def __contains__(self, address: object) -> bool:
        return address in self._index and isinstance(address, str) and self._admits(address)


def _number(value: object, path: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise InvalidServiceConfig(f"{path}: expected a number from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def _integer(value: object, path: str, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidServiceConfig(f"{path}: expected a whole number from {lo} to {hi}, got {value!r}")
    return value
