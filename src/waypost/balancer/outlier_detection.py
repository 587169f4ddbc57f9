"""outlier_detection: eject backends whose calls fail much more than the others' (gRPC A50).

Wraps any child policy (``childPolicy``, a ``loadBalancingConfig`` list read like the service config's:
the first policy waypost knows is used). The child is looked up in ``catalog``, not ``policies``, which
imports this module. Every call's outcome is counted per address; each ``interval`` the policy runs A50's
two algorithms over the counts of the interval that just ended:

- success rate (``successRateEjection``): among addresses with at least ``requestVolume`` calls, when
  there are at least ``minimumHosts`` of them, eject those whose success rate is below
  ``mean - stdev * stdevFactor / 1000``;
- failure percentage (``failurePercentageEjection``): same volume and host gates, eject those whose
  failure percentage is above ``threshold``.

Each ejection happens with probability ``enforcementPercentage`` and only while fewer than
``maxEjectionPercent`` of the addresses are ejected (so at least one ejection is always possible,
and never all addresses when the percentage is below 100). An ejected address comes back after
``baseEjectionTime * multiplier`` capped at ``max(baseEjectionTime, maxEjectionTime)``; its
multiplier grows by one per ejection and shrinks by one per interval spent un-ejected. An algorithm
whose object is absent from the config is disabled, as in A50 (its fields default as listed below).

Differences from grpc-go, on purpose: the evaluation runs lazily from pick/done when the policy
clock has passed the next interval (no timer thread; idle intervals collapse into one), and a call
counts as a failure only for the codes in ``stats.FAILURE_CODES`` (grpc-go counts every non-OK
status, so an application's NOT_FOUND could eject a healthy backend).

The child is rebuilt with the READY, non-ejected backends whenever either set changes; if every
READY backend is ejected (only possible with ``maxEjectionPercent`` 100) picks fail with
NoBackendAvailable, as the child would with all its backends in TRANSIENT_FAILURE.

Thread safety: one ``threading.Lock`` per policy guards counters and ejection state; the child
picker gives its own guarantees.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import metrics as _metrics
from ..durations import parse_config_duration
from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import Backend
from .base import Outcome, Picker, PickInfo, PickResult, Policy
from .catalog import get_policy, parse_lb_config_list
from .config_fields import check_fields, parse_config_object, policy_config
from .stats import StatsTable, dedupe, is_failure

log = logging.getLogger("waypost.balancer.outlier")

DEFAULTS: dict[str, Any] = {
    "interval": "10s",
    "baseEjectionTime": "30s",
    "maxEjectionTime": "300s",
    "maxEjectionPercent": 10,
}
SUCCESS_RATE_DEFAULTS = {"stdevFactor": 1900, "enforcementPercentage": 100, "minimumHosts": 5, "requestVolume": 100}
FAILURE_PERCENT_DEFAULTS = {"threshold": 85, "enforcementPercentage": 100, "minimumHosts": 5, "requestVolume": 50}
DEFAULT_CHILD: list[dict[str, Any]] = [{"round_robin": {}}]


def _uint(value: object, path: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidServiceConfig(f"{path}: expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise InvalidServiceConfig(f"{path}: must be {bounds}, got {value}")
    return value


def _sub(raw: object, path: str, defaults: Mapping[str, int], pct_fields: set[str]) -> dict[str, int] | None:
    if raw is None:
        return None
    cfg = parse_config_object(raw, path)
    check_fields(cfg, path, tuple(defaults))
    out: dict[str, int] = {}
    for key, default in defaults.items():
        hi = 100 if key in pct_fields else None
        out[key] = _uint(cfg.get(key, default), f"{path}.{key}", 0, hi)
    return out


@dataclass(frozen=True)
class OutlierConfig:
    interval: float
    base_ejection_time: float
    max_ejection_time: float
    max_ejection_percent: int
    success_rate: dict[str, int] | None
    failure_percentage: dict[str, int] | None
    child_name: str
    child_config: dict[str, Any]

    @classmethod
    def parse(cls, raw: object, path: str) -> OutlierConfig:
        known = (*DEFAULTS, "successRateEjection", "failurePercentageEjection", "childPolicy")
        cfg = policy_config(raw, path, "outlier_detection", known)
        interval = parse_config_duration(cfg.get("interval", DEFAULTS["interval"]), f"{path}.interval", positive=True)
        child = parse_lb_config_list(cfg.get("childPolicy", DEFAULT_CHILD), f"{path}.childPolicy")
        return cls(
            interval=interval,
            base_ejection_time=parse_config_duration(
                cfg.get("baseEjectionTime", DEFAULTS["baseEjectionTime"]), f"{path}.baseEjectionTime"
            ),
            max_ejection_time=parse_config_duration(
                cfg.get("maxEjectionTime", DEFAULTS["maxEjectionTime"]), f"{path}.maxEjectionTime"
            ),
            max_ejection_percent=_uint(
                cfg.get("maxEjectionPercent", DEFAULTS["maxEjectionPercent"]), f"{path}.maxEjectionPercent", 0, 100
            ),
            success_rate=_sub(
                cfg.get("successRateEjection"), f"{path}.successRateEjection", SUCCESS_RATE_DEFAULTS,
                {"enforcementPercentage"},
            ),
            failure_percentage=_sub(
                cfg.get("failurePercentageEjection"), f"{path}.failurePercentageEjection", FAILURE_PERCENT_DEFAULTS,
                {"enforcementPercentage", "threshold"},
            ),
            child_name=child.name,
            child_config=child.config,
        )


def _volume(counts: dict[str, tuple[int, int]], st: _AddrState) -> int:
    ok, bad = counts[st.address]
    return ok + bad


def _candidates(states: Sequence[_AddrState], counts: dict[str, tuple[int, int]], volume: int) -> list[_AddrState]:
    """Addresses with enough calls in the last interval (and at least one) to be judged."""
    return [st for st in states if _volume(counts, st) >= max(volume, 1)]


class _AddrState:
    __slots__ = ("address", "ejected_at", "failures", "multiplier", "successes")

    def __init__(self, address: str) -> None:
        self.address = address
        self.successes = 0  # calls of the current interval
        self.failures = 0
        self.ejected_at: float | None = None
        self.multiplier = 0


class OutlierDetectionPicker(Picker):
    def __init__(self, policy: OutlierDetectionPolicy) -> None:
        self._policy = policy

    def pick(self, info: PickInfo) -> PickResult:
        return self._policy._pick(info)


class OutlierDetectionPolicy(Policy):
    """Eject outliers (A50 success-rate and failure-percentage) from a child policy's backends."""

    name = "outlier_detection"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.settings = OutlierConfig.parse(self.config, "outlier_detection")
        self.child = get_policy(self.settings.child_name)(self.settings.child_config, clock=self.clock, rng=self.rng)
        self._lock = threading.Lock()
        self._states: StatsTable[_AddrState] = StatsTable(lambda b: _AddrState(b.address))
        self._ready: list[Backend] = []
        self._child_picker: Picker = self.child.build([])
        self._next_eval = self.clock() + self.settings.interval

    @property  # type: ignore[override]
    def target(self) -> str:
        """The channel's target (``Policy.target``); set on the child policy too, for its own metrics."""
        return self.child.target

    @target.setter
    def target(self, value: str) -> None:
        self.child.target = value

    def attach_waker(self, wake: Callable[[], None]) -> None:
        self.child.attach_waker(wake)  # a child with a concurrency limit wakes the calls waiting for it

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        OutlierConfig.parse(raw, path)  # validates; the policy re-reads the raw form
        return parse_config_object(raw, path)

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        with self._lock:
            self._states.sync(backends)
            self._ready = backends
            self._rebuild_child()
        return OutlierDetectionPicker(self)

    def _rebuild_child(self) -> None:
        usable = [b for b in self._ready if self._states.get(b.address).ejected_at is None]  # type: ignore[union-attr]
        self._child_picker = self.child.build(usable)

    def _pick(self, info: PickInfo) -> PickResult:
        now = self.clock()
        if now >= self._next_eval:
            self._evaluate(now)
        if not self._ready:
            raise NoBackendAvailable("outlier_detection: no READY backend")
        res = self._child_picker.pick(info)
        state = self._states.get(res.backend.address)
        if state is None:  # the set changed between the child's pick and now: do not count it
            return res
        child_done = res.done

        def done(outcome: Outcome) -> None:
            child_done(outcome)
            with self._lock:
                if is_failure(outcome.code):
                    state.failures += 1
                else:
                    state.successes += 1
            if self.clock() >= self._next_eval:
                self._evaluate(self.clock())

        return PickResult(res.backend, done)

    def _evaluate(self, now: float) -> None:
        with self._lock:
            if now < self._next_eval:
                return  # another thread evaluated meanwhile
            self._next_eval = now + self.settings.interval
            states = [st for _, st in self._states.items()]
            counts = {st.address: (st.successes, st.failures) for st in states}
            for st in states:
                st.successes = st.failures = 0
            before = {st.address for st in states if st.ejected_at is not None}
            if self.settings.success_rate is not None:
                self._success_rate(now, states, counts, self.settings.success_rate)
            if self.settings.failure_percentage is not None:
                self._failure_percentage(now, states, counts, self.settings.failure_percentage)
            s = self.settings
            for st in states:
                if st.ejected_at is None:
                    if st.multiplier > 0:
                        st.multiplier -= 1
                else:
                    duration = min(s.base_ejection_time * st.multiplier, max(s.base_ejection_time, s.max_ejection_time))
                    if now >= st.ejected_at + duration:
                        st.ejected_at = None
                        log.info("un-ejecting %s", st.address)
            after = {st.address for st in states if st.ejected_at is not None}
            if after != before:
                self._rebuild_child()

    def _can_eject(self, states: Sequence[_AddrState]) -> bool:
        ejected = sum(1 for st in states if st.ejected_at is not None)
        return ejected * 100 < self.settings.max_ejection_percent * len(states)

    def _eject(self, now: float, st: _AddrState, enforcement: int, why: str) -> None:
        if self.rng.randrange(100) < enforcement:
            st.ejected_at = now
            st.multiplier += 1
            log.warning("ejecting %s: %s (multiplier %d)", st.address, why, st.multiplier)
            obs = _metrics.current
            if obs is not None:
                obs.backend_ejected(st.address, self.target)

    def _success_rate(self, now: float, states: Sequence[_AddrState], counts: dict[str, tuple[int, int]],
                      cfg: dict[str, int]) -> None:
        cands = _candidates(states, counts, cfg["requestVolume"])
        if len(cands) < cfg["minimumHosts"] or not cands:
            return
        rates = {st.address: counts[st.address][0] / _volume(counts, st) for st in cands}
        mean = sum(rates.values()) / len(rates)
        stdev = math.sqrt(sum((r - mean) ** 2 for r in rates.values()) / len(rates))
        threshold = mean - stdev * (cfg["stdevFactor"] / 1000)
        for st in cands:
            if st.ejected_at is not None or rates[st.address] >= threshold:
                continue
            if not self._can_eject(states):
                return
            self._eject(now, st, cfg["enforcementPercentage"],
                        f"success rate {rates[st.address]:.3f} below {threshold:.3f}")

    def _failure_percentage(self, now: float, states: Sequence[_AddrState], counts: dict[str, tuple[int, int]],
                            cfg: dict[str, int]) -> None:
        cands = _candidates(states, counts, cfg["requestVolume"])
        if len(cands) < cfg["minimumHosts"] or not cands:
            return
        for st in cands:
            ok, bad = counts[st.address]
            pct = 100 * bad / (ok + bad)
            if st.ejected_at is not None or pct <= cfg["threshold"]:
                continue
            if not self._can_eject(states):
                return
            self._eject(now, st, cfg["enforcementPercentage"], f"failure percentage {pct:.1f} above {cfg['threshold']}")

    def ejected(self) -> set[str]:
        """Addresses ejected right now."""
        with self._lock:
            return {addr for addr, st in self._states.items() if st.ejected_at is not None}
