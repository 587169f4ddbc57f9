"""Hedging (gRFC A6 ``hedgingPolicy``): when the next copy of a call goes out, and whether it may. Pure logic on an
injected clock, used by the channels' hedged calls (``hedging_sync``, ``hedging_aio``) and by
``bench/hedging.py``'s simulation alike.

One call (``HedgePlan``): the first attempt goes out at once; another every hedging delay while none has
answered, up to ``maxAttempts``; a non-fatal status sends the next one at once; ``grpc-retry-pushback-ms`` >= 0
sends it after that many ms, < 0 (or unreadable) stops hedging; a fatal status ends the call. A hedge is sent only
while the channel's retry throttle (``retryThrottling``) is above half its tokens (A6), and while the channel's
hedges stay within ``maxExtraShare`` of its calls (``ExtraShare``, waypost's addition).

One channel (``ChannelHedging``): the extra-share budget, and per method the recent latencies behind an adaptive
delay (``"hedgingDelay": "p95"``: ``LatencyQuantile``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from ..balancer.base import Outcome, PickError, PickResult
from ..balancer.failure import pushback_of
from ..service_config import HedgingPolicy
from ..types import CallMetadata
from .retry import PREVIOUS_ATTEMPTS, never_sent
from .retry_throttle import RetryThrottle

__all__ = ["CANCELLED_PICK", "ChannelHedging", "ExtraShare", "HedgePlan", "LatencyQuantile", "MethodHedging", "RaceState"]

#: the outcome of a pick released unused (its ``done`` must run exactly once)
CANCELLED_PICK = Outcome(grpc.StatusCode.CANCELLED, 0.0)



class LatencyQuantile:
    """A quantile of the last ``window`` latencies (a ring buffer), re-sorted every ``every`` new samples; None
    until ``min_samples`` are in. Small and recent: the delay follows the method's latency as it moves."""

    __slots__ = ("_cached", "_i", "_since", "_values", "every", "min_samples", "q", "window")

    def __init__(self, q: float, *, window: int = 512, min_samples: int = 50, every: int = 16) -> None:
        if not 0 < q < 1:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        self.q = q
        self.window = window
        self.min_samples = min_samples
        self.every = every
        self._values: list[float] = []
        self._i = 0
        self._since = 0
        self._cached: float | None = None

    def add(self, seconds: float) -> None:
        values = self._values
        if len(values) < self.window:
            values.append(seconds)
        else:
            values[self._i] = seconds
            self._i = (self._i + 1) % self.window
        self._since += 1

    def value(self) -> float | None:
        values = self._values
        if len(values) < self.min_samples:
            return None
        if self._cached is None or self._since >= self.every:
            ordered = sorted(values)
            self._cached = ordered[min(len(ordered) - 1, math.ceil(self.q * len(ordered)) - 1)]
            self._since = 0
        return self._cached


class ExtraShare:
    """The channel's budget of hedges as a share of its calls: each hedged-method call earns ``share`` of a hedge,
    each hedge spends one, so hedges never exceed ``share`` x calls. The balance is capped (``burst``: at least 10
    hedges, or one 100-call fan-out's share) so a long quiet spell does not bank a flood."""

    def __init__(self) -> None:
        self.balance = 0.0
        self.calls = 0
        self.hedges = 0
        self._lock = threading.Lock()

    def note_call(self, share: float) -> None:
        with self._lock:
            self.calls += 1
            self.balance = min(self.balance + share, max(10.0, 100 * share))

    def take(self) -> bool:
        """Spend one hedge if the balance has it."""
        with self._lock:
            if self.balance < 1.0:
                return False
            self.balance -= 1.0
            self.hedges += 1
            return True


class MethodHedging:
    """One method's hedging on one channel: its policy, the channel's budget and throttle, and (adaptive delay)
    its recent latencies. ``plan`` starts a call."""

    def __init__(self, policy: HedgingPolicy, share: ExtraShare, throttle: RetryThrottle | None,
                 clock: Callable[[], float], latencies: LatencyQuantile | None) -> None:
        self.policy = policy
        self.share = share
        self.throttle = throttle
        self.clock = clock
        self.latencies = latencies

    def delay(self) -> float:
        """The hedging delay for a call starting now."""
        p = self.policy
        if self.latencies is None:
            return p.delay
        q = self.latencies.value()
        return p.fallback_delay if q is None else max(q, p.min_delay)

    def plan(self) -> HedgePlan:
        self.share.note_call(self.policy.max_extra_share)
        return HedgePlan(self)


class ChannelHedging:
    """A channel's hedging state: the extra-share budget and the per-method latencies."""

    def __init__(self, throttle: RetryThrottle | None, clock: Callable[[], float]) -> None:
        self.throttle = throttle
        self.clock = clock
        self.share = ExtraShare()
        self._latencies: dict[tuple[str, float], LatencyQuantile] = {}
        self._lock = threading.Lock()

    def for_method(self, method: str, policy: HedgingPolicy | None) -> MethodHedging | None:
        if policy is None:
            return None
        latencies = None
        if policy.delay_quantile is not None:
            key = (method, policy.delay_quantile)
            with self._lock:
                latencies = self._latencies.get(key)
                if latencies is None:
                    latencies = self._latencies[key] = LatencyQuantile(policy.delay_quantile)
        return MethodHedging(policy, self.share, self.throttle, self.clock, latencies)


class HedgePlan:
    """The hedging decisions of one call (not thread-safe: one call's driver owns it).

    The driver asks ``wait()`` how long until the next hedge is due (None: no more will come), calls ``admit()``
    when one is due and it has an untried backend for it, ``stop()`` when it has none, and reports each attempt's
    end: ``failed`` (True: the call ends with this status) or ``succeeded`` (the call committed to that attempt).
    """

    __slots__ = ("_next_at", "delay", "m", "sent", "start")

    def __init__(self, m: MethodHedging) -> None:
        self.m = m
        self.start = m.clock()
        self.delay = m.delay()
        self.sent = 1  # the first attempt goes out at once, whatever the budget
        self._next_at: float | None = self.start + self.delay

    def wait(self) -> float | None:
        """Seconds until the next hedge is due (0: now), or None when no more hedges will be sent."""
        if self._next_at is None:
            return None
        if self.sent >= self.m.policy.max_attempts:
            self._next_at = None
            return None
        return max(0.0, self._next_at - self.m.clock())

    def admit(self) -> bool:
        """A hedge is due and has a backend: may it go? (A6: the throttle above half its tokens; waypost: within
        the extra share.) Counts it if so; if not, no more hedges for this call."""
        throttle = self.m.throttle
        if (throttle is not None and not throttle.allows_retry()) or not self.m.share.take():
            self._next_at = None
            return False
        self.sent += 1
        self._next_at = self.m.clock() + self.delay
        return True

    def stop(self) -> None:
        """No more hedges for this call (no untried backend left)."""
        self._next_at = None

    def failed(self, code: grpc.StatusCode, pushback: float | None = None, *, not_sent: bool = False) -> bool:
        """An attempt ended with ``code`` (not OK). True: fatal, the call ends with it and the others are cancelled.
        Otherwise the next hedge is due at once, or after ``pushback`` seconds (the server's ``grpc-retry-pushback-ms``
        as ``balancer.failure.pushback_of`` reads it; < 0: none). ``not_sent``: the attempt
        never reached a server (not a failure for the throttle)."""
        fatal = not not_sent and code not in self.m.policy.non_fatal_status_codes
        throttle = self.m.throttle
        if throttle is not None and not not_sent and (not fatal or (pushback is not None and pushback < 0)):
            throttle.record_failure()  # A6: non-fatal codes and "do not retry" pushbacks count as failures
        if fatal:
            return True
        if self._next_at is not None:
            if pushback is None:
                self._next_at = self.m.clock()
            elif pushback < 0:
                self._next_at = None
            else:
                self._next_at = self.m.clock() + pushback
        return False

    def succeeded(self) -> None:
        """The call committed to an attempt that answered (OK, or a stream's first message): the throttle gets a
        success, and the adaptive delay the call's latency."""
        m = self.m
        if m.throttle is not None:
            m.throttle.record_success()
        if m.latencies is not None:
            m.latencies.add(m.clock() - self.start)


def pick_untried(pickers: Any, info: Any, tried: set[str]) -> tuple[PickResult, Any] | None:
    """A pick for a hedge on a backend this call has not tried, or None when every READY backend was tried (no
    more hedges, A6 leaves it to the implementation). The policy is asked again a few times so the hedge counts in
    its in-flight like any pick; only if it keeps choosing tried backends is an untried one taken directly."""
    ready = pickers.snap.ready
    untried = [sc for addr, sc in ready.items() if addr not in tried]
    if not untried:
        return None
    for _ in range(2 * len(ready) + 1):
        try:
            picked = pickers.pick(info)
        except PickError:
            return None
        if picked is None:
            return None
        if picked[1].address not in tried:
            return picked  # type: ignore[no-any-return]
        picked[0].done(CANCELLED_PICK)
    sc = untried[0]
    return PickResult(sc.backend), sc


class RaceState:
    """What the sync and the grpc.aio race of one hedged call both hold: the method, its plan, the call's
    arguments for every attempt, the backends tried and the attempts still running (``hedging_sync``,
    ``hedging_aio``)."""

    def __init__(self, m: Any, request: Any, deadline: float | None, metadata: CallMetadata | None,
                 credentials: grpc.CallCredentials | None,
                 wfr: bool | None, compression: grpc.Compression | None, stream: bool) -> None:
        assert m.hedging is not None
        self.m = m
        self.plan: HedgePlan = m.hedging.plan()
        self._request = request
        self._deadline = deadline
        self._metadata = metadata
        self._credentials = credentials
        self._compression = compression
        self._wfr = wfr
        self._stream = stream
        self.tried: set[str] = set()
        self.started = 0
        self.live: list[Any] = []  # the attempts still running
        self.last: tuple[Any, str, Any] | None = None  # the last attempt that failed

    _launch: Callable[[Any], None]  # starts an attempt (a begun pick): the sync and the aio race each have theirs

    def _due(self) -> float | None | bool:
        """Send the hedges that are due; then the seconds to wait for an attempt's end (None: no limit), or True
        when the call ends with ``last``, its last failed attempt (every attempt failed with a non-fatal code)."""
        while (wait := self.plan.wait()) == 0:
            self._hedge()
        if wait is None and not self.live:
            assert self.last is not None
            self._commit(self.last[0])
            return True
        return wait

    def _ended(self, event: tuple[Any, str, Any], answered: bool) -> bool:
        """An attempt ended (``event``: attempt, kind, payload; ``answered``: with a response, a stream's first
        message or its end, else with an error as payload): True when the call commits to it."""
        att, _kind, payload = event
        self.live.remove(att)
        if answered:
            self.plan.succeeded()
        else:
            code, details = payload.code(), payload.details()
            pushback = pushback_of(tuple(payload.trailing_metadata() or ()))
            if not self.plan.failed(code, pushback, not_sent=never_sent(code, details)):
                self.last = event
                return False
        self._commit(att)
        return True

    def _next_metadata(self) -> Any:
        """The metadata of the next attempt: a hedge says how many went before it (A6)."""
        md = self._metadata
        if self.started:
            md = (*(md or ()), (PREVIOUS_ATTEMPTS, str(self.started)))
        self.started += 1
        return md

    def _commit(self, att: Any) -> None:
        """The call goes on with ``att``: cancel the others (their servers see the cancellation)."""
        self.plan.stop()
        for other in self.live:
            other.call.cancel()
        self.live.clear()

    def _hedge(self) -> None:
        """The next hedge, on a backend not tried yet: none (and no more) past the deadline or with every READY
        backend tried; none this time when the share of hedges is spent."""
        m, plan = self.m, self.plan
        if self._deadline is not None and time.monotonic() >= self._deadline:
            plan.stop()
            return
        picked = pick_untried(m.pickers, m.pick_info(self._metadata), self.tried)
        if picked is None:
            plan.stop()
            return
        if not plan.admit():
            picked[0].done(CANCELLED_PICK)
            return
        self._launch(m.begin(self._metadata, self._deadline, self.tried, picked=picked))
