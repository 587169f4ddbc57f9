"""weighted_round_robin: gRPC's weighted round robin over ORCA load reports (gRFC A58), under gRPC's name and
config, so that a service config written for grpc-go or grpc-java means the same here.

Each backend's weight is ``qps / (utilization + eps / qps * errorUtilizationPenalty)``, with ``utilization`` the
report's ``application_utilization`` when it is above 0, else its ``cpu_utilization``. A report with no qps or
no utilization does not change the weight. Reports come per call (the server's trailer; waypost servers send it
as ``waypost-load-metrics-bin`` too, the key a Python client can read: see ``waypost.orca``) or, with
``enableOobLoadReport``, from one ``OpenRcaService/StreamCoreMetrics`` stream per backend asking for a report
every ``oobReportingPeriod`` (per-call reports are then not read at all, as in gRPC).

A weight counts once the backend has reported for ``blackoutPeriod`` (since its first report, or its first after
the weight expired) and until it is older than ``weightExpirationPeriod``. Every ``weightUpdatePeriod``
(at least 100 ms) the picker's weights are recomputed: a backend without a valid weight gets the mean of the
others; with no valid weight at all (or a single backend) it is plain round robin. Picks follow A58's static
stride scheduler (weights scaled to 65535, a shared sequence number, a random start).

Config (``loadBalancingConfig`` entry ``{"weighted_round_robin": {...}}``, gRPC's camelCase JSON names):
``enableOobLoadReport`` (false), ``oobReportingPeriod`` ("10s"), ``blackoutPeriod`` ("10s"),
``weightExpirationPeriod`` ("180s"), ``weightUpdatePeriod`` ("1s", raised to 0.1 s), ``errorUtilizationPenalty``
(1.0, >= 0).

A report that cannot be read (not an ``OrcaLoadReport``, NaN, infinite or negative values, a memory or named
utilization above 1) is ignored, logged once per backend: that backend keeps the mean of the others' weights.
The update timer runs on the policy's clock, checked at pick time (no thread), so tests drive it with a fake clock.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import metrics as _metrics
from ..durations import parse_config_duration
from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..orca import MIRROR_KEY, OOB_METHOD, TRAILER_KEY, available, oob_request
from ..orca.parse import LoadReport, ReportError, parse_report_or_error
from ..types import Backend
from .base import DoneHook, LoadProber, Outcome, Picker, PickInfo, PickResult, Policy
from .config_fields import policy_config
from .stats import StatsTable, dedupe

log = logging.getLogger("waypost.balancer.weighted_round_robin")

__all__ = ["OrcaWeightedRoundRobinPolicy", "StaticStrideScheduler"]

DEFAULTS: dict[str, Any] = {
    "enableOobLoadReport": False,
    "oobReportingPeriod": 10.0,
    "blackoutPeriod": 10.0,
    "weightExpirationPeriod": 180.0,
    "weightUpdatePeriod": 1.0,
    "errorUtilizationPenalty": 1.0,
}
MIN_UPDATE_PERIOD = 0.1
MAX_WEIGHT = 65535
MIN_RATIO = 0.01  # a scaled weight is at least this fraction of the largest (A58's static stride scheduler)
_DURATIONS = ("oobReportingPeriod", "blackoutPeriod", "weightExpirationPeriod", "weightUpdatePeriod")


class _Endpoint:
    __slots__ = ("address", "bad_logged", "last_updated", "non_empty_since", "weight")

    def __init__(self, address: str) -> None:
        self.address = address
        self.weight = 0.0
        self.non_empty_since: float | None = None
        self.last_updated = -math.inf
        self.bad_logged = False


class StaticStrideScheduler:
    """A58's static stride scheduler over fixed weights (0 = no valid weight: gets the mean of the others)."""

    def __init__(self, weights: Sequence[float], start: int) -> None:
        n = len(weights)
        valid = [w for w in weights if w > 0]
        self.round_robin = len(valid) == 0 or n < 2
        self._n = n
        self._seq = itertools.count(start)  # next() on a count is atomic in CPython: picks share it lock-free
        if self.round_robin:
            self.scaled: list[int] = [1] * n
            return
        mean = sum(valid) / len(valid)
        filled = [w if w > 0 else mean for w in weights]
        top = max(filled)
        lower = max(1, math.ceil(MAX_WEIGHT * MIN_RATIO))
        self.scaled = [max(lower, round(w / top * MAX_WEIGHT)) for w in filled]

    def pick(self) -> int:
        n = self._n
        if self.round_robin:
            return next(self._seq) % n
        scaled, offset = self.scaled, MAX_WEIGHT // 2
        while True:  # ends within one generation per index: the largest weight is MAX_WEIGHT
            seq = next(self._seq)
            index, generation = seq % n, seq // n
            w = scaled[index]
            if (w * generation + index * offset) % MAX_WEIGHT >= MAX_WEIGHT - w:
                return index


class _OrcaWrrPicker(Picker):
    def __init__(self, policy: OrcaWeightedRoundRobinPolicy, backends: Sequence[Backend],
                 endpoints: Sequence[_Endpoint]) -> None:
        self._policy = policy
        self._backends = tuple(backends)
        self._endpoints = tuple(endpoints)
        self._lock = threading.Lock()
        self._hooks = tuple(policy._done_hook(ep) for ep in endpoints)
        self._wants = not policy.oob and policy.readable
        self._scheduler = StaticStrideScheduler([0.0] * len(backends), policy.rng.randrange(1 << 30))
        self._next_update = -math.inf
        self._update(policy.clock())

    def _update(self, now: float) -> None:
        weights = [self._policy._weight_now(ep, now) for ep in self._endpoints]
        self._scheduler = StaticStrideScheduler(weights, self._policy.rng.randrange(1 << 30))
        self._next_update = now + self._policy.update_period
        obs = _metrics.current
        if obs is not None:  # gRFC A78's grpc.lb.wrr.* metrics
            expiration = self._policy.expiration
            stale = sum(1 for ep in self._endpoints if ep.last_updated > -math.inf and
                        now - ep.last_updated >= expiration)
            unusable = sum(1 for w in weights if w <= 0) - stale
            obs.wrr_scheduler_update(self._policy.target, weights, unusable, stale, self._scheduler.round_robin)

    def weights(self) -> list[int]:
        """The scaled weights picks follow now (for tests and introspection)."""
        return list(self._scheduler.scaled)

    def pick(self, info: PickInfo) -> PickResult:
        if not self._backends:
            raise NoBackendAvailable("weighted_round_robin: no READY backend")
        now = self._policy.clock()
        if now >= self._next_update and self._lock.acquire(blocking=False):
            try:
                if now >= self._next_update:
                    self._update(now)
            finally:
                self._lock.release()
        i = self._scheduler.pick()
        return PickResult(self._backends[i], self._hooks[i], self._wants)


class OrcaWeightedRoundRobinPolicy(Policy):
    """gRPC's weighted_round_robin (A58) over ORCA load reports; see the module doc."""

    name = "weighted_round_robin"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        cfg = {**DEFAULTS, **self.config}
        self.oob = bool(cfg["enableOobLoadReport"])
        self.oob_period = float(cfg["oobReportingPeriod"])
        self.blackout = float(cfg["blackoutPeriod"])
        self.expiration = float(cfg["weightExpirationPeriod"])
        self.update_period = max(MIN_UPDATE_PERIOD, float(cfg["weightUpdatePeriod"]))
        self.penalty = float(cfg["errorUtilizationPenalty"])
        self.readable = available()  # without xds-protos no report can be read: round robin, said once
        self.wants_load_reports = self.oob and self.readable  # type: ignore[misc]
        self._lock = threading.Lock()
        self._endpoints: StatsTable[_Endpoint] = StatsTable(lambda b: _Endpoint(b.address))
        self._prober: LoadProber | None = None
        self._streaming: set[str] = set()
        self._registration_weights_noted = False

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, set(DEFAULTS))
        for key in _DURATIONS:
            if key in cfg:
                cfg[key] = parse_config_duration(cfg[key], f"{path}.{key}")
        if "enableOobLoadReport" in cfg and not isinstance(cfg["enableOobLoadReport"], bool):
            raise InvalidServiceConfig(f"{path}.enableOobLoadReport: expected true or false")
        if "errorUtilizationPenalty" in cfg:
            v = cfg["errorUtilizationPenalty"]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidServiceConfig(f"{path}.errorUtilizationPenalty: expected a number >= 0, got {v!r}")
            cfg["errorUtilizationPenalty"] = float(v)
        return cfg

    def attach_prober(self, prober: LoadProber) -> None:
        self._prober = prober

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        if not self._registration_weights_noted and any("weight" in b.metadata for b in backends):
            self._registration_weights_noted = True
            log.warning("weighted_round_robin is gRPC's policy (A58): weights come from the servers' ORCA load "
                        "reports, and the backends' registered 'weight' metadata is not used; "
                        "smooth_weighted_round_robin balances on registered weights")
        with self._lock:
            endpoints = self._endpoints.sync(backends)
        if self._prober is not None:
            self._sync_streams([b.address for b in backends])
        return _OrcaWrrPicker(self, backends, endpoints)

    def _sync_streams(self, addresses: list[str]) -> None:
        prober = self._prober
        assert prober is not None
        wanted = set(addresses)
        for gone in self._streaming - wanted:
            prober.close_stream(gone, OOB_METHOD)
        request = oob_request(self.oob_period)
        opened = set()
        for address in addresses:
            ep = self._endpoints.get(address)
            if ep is not None and prober.open_stream(address, OOB_METHOD, request, self._oob_hook(ep)):
                opened.add(address)
        self._streaming = opened

    # ---- reports ---------------------------------------------------------------------------------------

    def _oob_hook(self, ep: _Endpoint) -> Callable[[bytes], None]:
        def on_message(data: bytes) -> None:
            self._on_report(ep, data)

        return on_message

    def _done_hook(self, ep: _Endpoint) -> DoneHook:
        def done(outcome: Outcome) -> None:
            md = outcome.trailing_metadata
            if not md:
                return
            data = None
            for key, value in md:
                if key == MIRROR_KEY or (key == TRAILER_KEY and data is None):
                    data = value
            if data is not None:
                self._on_report(ep, data)

        return done

    def _on_report(self, ep: _Endpoint, data: str | bytes) -> None:
        try:
            report = parse_report_or_error(data if isinstance(data, bytes) else str(data).encode())
        except (ReportError, LookupError) as e:
            if not ep.bad_logged:
                ep.bad_logged = True
                log.warning("weighted_round_robin: ignoring a load report of %s: %s (logged once per backend; "
                            "it keeps the mean of the other weights)", ep.address, e)
            return
        self.on_load_report(ep.address, report)

    def on_load_report(self, address: str, report: LoadReport) -> None:
        """A parsed report of ``address`` (per call or out of band): A58's weight update."""
        utilization = report.application_utilization if report.application_utilization > 0 \
            else report.cpu_utilization
        qps = report.rps_fractional
        if utilization > 0 and qps > 0 and self.penalty > 0:
            utilization += report.eps / qps * self.penalty
        if qps <= 0 or utilization <= 0:
            return
        now = self.clock()
        with self._lock:
            ep = self._endpoints.get(address)
            if ep is None:
                return
            if ep.non_empty_since is None:
                ep.non_empty_since = now
            ep.last_updated = now
            ep.weight = qps / utilization

    def _weight_now(self, ep: _Endpoint, now: float) -> float:
        with self._lock:
            if now - ep.last_updated >= self.expiration:
                ep.non_empty_since = None
                return 0.0
            since = ep.non_empty_since
            if since is None or (self.blackout > 0 and now - since < self.blackout):
                return 0.0
            return ep.weight

    def weights(self) -> dict[str, float]:
        """address -> the weight a picker built now would use (0: none yet), for tests and introspection."""
        now = self.clock()
        with self._lock:
            eps = list(self._endpoints.items())
        return {a: self._weight_now(ep, now) for a, ep in eps}
