"""least_request: power of ``choiceCount`` choices on the in-flight request count (gRPC A48).

Each pick draws ``choiceCount`` backends at random (with replacement, as grpc-go does) and takes the
one with the fewest calls in flight (the first drawn on ties). When the registered weights differ, the draws are
by weight and calls in flight / weight is compared (weighted P2C, ``weights.Capacity``): idle, every draw ties and
the first one drawn, a backend with probability its weight's share, is taken; under load in-flight counts follow
the weights. Weight 0 drains. In-flight counts are kept in the policy by address, so they survive rebuilds, and a
``done`` from an older picker still decrements the right counter.

Failures (``failure``): a backend's recent failures count as more calls in flight (a penalty that fades, cleared by
an answer to a call sent after them), so a backend that fails fast, holding no call for long, does not draw the
calls; a failing one, or one silent for over twice its usual latency (a black hole), drawn every time is compared
with another backend all the same; one that sent ``grpc-retry-pushback-ms`` loses every comparison with one that did
not, for that long; cancelled calls and deadlines below the backend's usual latency do not count.

Thread safety: one ``threading.Lock`` per policy guards the counters' increments and decrements;
the comparison reads them without the lock (a slightly stale count only changes a tie-break).

Config: ``choiceCount`` (2..10, default 2); ``methodCosts`` (``method_costs``: a call of a listed method
counts as that many calls in flight); ``slowStartWindow`` (``slow_start``: a new backend's share ramps up
over the window; default off); ``concurrencyLimit`` (``concurrency_limit``: an adaptive limit of calls in flight
per backend; beyond every backend's, calls wait in the client; default off).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Backend
from . import concurrency_limit, method_costs, p2c, slow_start
from .base import DoneHook, Outcome, Picker, PickInfo, PickResult
from .config_fields import policy_config
from .failure import BackendFailures, prefer_second
from .load_aware import LoadAwarePolicy
from .weights import CapacityPicker, no_backend

log = logging.getLogger("waypost.balancer.least_request")

DEFAULT_CHOICE_COUNT = 2


CONFIG_FIELDS = {"choiceCount", method_costs.FIELD, slow_start.FIELD, concurrency_limit.FIELD}


class _Inflight:
    __slots__ = ("born", "count", "failures", "limit")

    def __init__(self, born: float = slow_start.NOT_RAMPING, limit: concurrency_limit.BackendLimit | None = None
                 ) -> None:
        self.count = 0  # calls in flight, each counted at its method's cost
        self.born = born  # when its slow start began
        self.failures = BackendFailures()
        self.limit = limit  # its concurrency limit (``concurrencyLimit``; None: off)


class LeastRequestPicker(CapacityPicker["LeastRequestPolicy", _Inflight]):
    """``_stats``: each backend's calls in flight (``_Inflight``)."""

    def _fewer(self, i: int, best: int, now: float) -> bool:
        """Whether ``i`` has fewer calls in flight than ``best``, failure penalties included; when the weights
        differ, calls / weight compared (cross-multiplied). A backend that pushed back loses to one that did not."""
        si, sb = self._stats[i], self._stats[best]
        pushed = prefer_second(sb.failures, si.failures, now)
        if pushed is not None:
            return pushed
        w = self._weights
        ci, cb = si.count + si.failures.penalty(now), sb.count + sb.failures.penalty(now)
        return ci < cb if w is None else ci * w[best] < cb * w[i]

    def _draw(self, count: int) -> list[int]:
        """``count`` indices with replacement: uniform, or by weight when the weights differ."""
        rng = self._policy.rng
        return p2c.choices(rng, len(self._backends), count) if self._draws is None else self._draws.choices(rng, count)

    def _fewest(self, drawn: Sequence[int], now: float) -> int:
        """The draw with the fewest calls in flight (the first drawn on ties)."""
        best = drawn[0]
        for i in drawn[1:]:
            if self._fewer(i, best, now):
                best = i
        return best

    def pick(self, info: PickInfo) -> PickResult:
        n = len(self._backends)
        if n == 0:
            raise no_backend(LeastRequestPolicy.name, self._drained)
        policy = self._policy
        drawn = self._draw(policy.choice_count)
        now = policy.clock()
        best = self._pick_ramped(n, drawn, now) if policy.slow_start.window else self._fewest(drawn, now)
        if n > 1 and all(i == best for i in drawn) and self._stats[best].failures.troubled(now):
            # drawn every time, with replacement: a failing (or silent) backend is still compared with another one
            other = policy.rng.randrange(n - 1) if self._draws is None else self._draws.other(policy.rng, best)
            if self._draws is None and other >= best:
                other += 1
            if self._fewer(other, best, now):
                best = other
        counter = self._stats[best]
        cost = policy.costs.get(info.method, 1) if policy.costs else 1
        with policy.lock:
            limit = counter.limit
            if limit is not None and limit.full():  # the fewest among those with room (``concurrency_limit``)
                stats = self._stats
                best = self._fewest(concurrency_limit.room(
                    [c.limit for c in stats], lambda k: stats[k].failures.troubled(now),
                    lambda k: stats[k].failures.trial_due(now), LeastRequestPolicy.name), now)
                counter = stats[best]
                limit = counter.limit
            sent_with = 0 if limit is None else limit.acquire()
            counter.count += cost
            counter.failures.picked(now)
        return PickResult(self._backends[best], policy._done_hook(counter, cost, sent_with))

    def _pick_ramped(self, n: int, drawn: Sequence[int], now: float) -> int:
        """The choice with slow start on: the same draws, compared among the admitted ones. When none is (every draw
        is a ramping backend, e.g. the same one drawn twice), up to ``choiceCount`` more single draws, the first
        admitted one taken (else the last): comparing the rejected draws anyway would hand a ramping backend
        every pick where it is all that was drawn (1/16 of the picks with 4 backends and 2 draws)."""
        policy = self._policy
        ramp = policy.slow_start
        admitted = [i for i in drawn if ramp.admits(self._stats[i].born, now)]
        if admitted:
            return self._fewest(admitted, now)
        i = drawn[-1]
        for _ in range(policy.choice_count):
            i = policy.rng.randrange(n) if self._draws is None else self._draws.draw(policy.rng)
            if ramp.admits(self._stats[i].born, now):
                break
        return i


class LeastRequestPolicy(LoadAwarePolicy[_Inflight]):
    """Pick the least loaded of ``choiceCount`` random backends, by calls in flight."""

    name = "least_request"
    log = log

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.choice_count = int(self.config.get("choiceCount", DEFAULT_CHOICE_COUNT))
        self.costs: dict[str, int] = dict(self.config.get(method_costs.FIELD, {}))

    def _new_stats(self, backend: Backend) -> _Inflight:
        limit = None if self.limits is None else concurrency_limit.BackendLimit(self.limits)
        return _Inflight(self.slow_start.born(self.clock()), limit)

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, CONFIG_FIELDS)
        method_costs.parse_costs(cfg, path)
        slow_start.parse_window(cfg, path)
        concurrency_limit.parse_limit(cfg, path)
        p2c.parse_choice_count(cfg, path)
        return cfg

    def build(self, backends: Sequence[Backend]) -> Picker:
        return LeastRequestPicker(self, *self._rebuild(backends))

    def _done_hook(self, counter: _Inflight, cost: int = 1, sent_with: int = 0) -> DoneHook:
        """``sent_with``: ``BackendLimit.acquire``'s count (0: no limit)."""
        def done(outcome: Outcome) -> None:
            now = self.clock()
            freed = False
            with self.lock:
                counter.count -= cost
                verdict = counter.failures.ended(outcome, now, counter.count)
                if counter.limit is not None and sent_with:
                    freed = counter.limit.release(verdict, sent_with)
            if freed:
                self._freed()

        return done

    def inflight(self) -> dict[str, int]:
        """address -> calls in flight (each counted at its method's cost)."""
        with self.lock:
            return {addr: c.count for addr, c in self._stats.items()}
