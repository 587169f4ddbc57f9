"""Failure-aware load: what the load-aware policies (peak_ewma, least_request, prequal) do with calls that fail.

A backend that fails fast has nothing in flight and a short latency, so a picker that compares latency x (in flight
+ 1), or calls in flight alone, sends it *more* calls than a healthy one. This module is the one place that turns
how calls end into load, for every policy that plugs it into its ``done`` hook and its comparison:

- **a failure is a penalty in in-flight units, not a latency.** Each failed call (``stats.FAILURE_CODES``) adds
  ``FAILURE_WEIGHT`` calls' worth of load, twice as much for each failure in a row (``FAILURE_WEIGHT * 2**(streak
  - 1)``, the streak capped at ``MAX_STREAK``; a failure counts in the streak when its call was sent after the
  previous failure came back: the calls of one burst, in flight together, are one failure of the streak); the
  penalty fades with time constant ``FAILURE_MEMORY`` (Palantir dialogue's balanced channel adds 10 in-flight
  units per failure fading over 30 s). It is the same whatever the failure's latency: a
  backend failing as slowly as the others succeed loses its traffic too. A success of a call *sent after* the
  last failure clears it: a backend that recovered regains its share from its first good answer (answers of calls
  sent before it started failing say nothing about now);
- **trials.** A penalised backend not picked for ``TRIAL_INTERVAL * 2**(streak - 1)`` seconds (at most
  ``MAX_TRIAL_INTERVAL``) wins its next comparison: one call finds out whether it recovered (its success clears the
  penalty), however low the others' load keeps the bar. Each failed trial doubles the wait, so a backend down for
  long costs a call every ``MAX_TRIAL_INTERVAL`` per client, and one down briefly is back within seconds;
- **silence is latency.** From the second call picked since a backend's last answer, the age of that call is a
  lower bound of the backend's latency (it has been outstanding that long): a backend that accepts calls and never
  answers (a black hole) looks slower and slower, instead of looking as fast as its last answers while its
  estimate decays. (The second, not the first: one long-lived stream must not make a backend look silent.)
- **request errors count a little.** A code about the request (INVALID_ARGUMENT, NOT_FOUND, ...: neither OK nor a
  failure) is an answer, but adds ``REQUEST_ERROR_WEIGHT`` (a tenth of a first failure: one call in flight;
  dialogue weighs a 4xx a hundredth of a 5xx, which in bench/dialogue.py's fast-400s scenario still let 8.8 % of
  the calls be rejected, against dialogue's 6.4 %) and its latency is sampled only when it raises the estimate: a
  backend that rejects every call in 20 ms (a bad deploy answering "invalid") must not look faster than the ones
  doing the work, while the background rate of request errors a healthy backend returns, among its successes,
  costs it nothing (a success clears the penalty);
- **the caller's own ends do not count.** CANCELLED (the caller cancelled, a retry dropped its pick) is neither a
  success nor a failure: no penalty, no latency sample. DEADLINE_EXCEEDED after less than the backend's usual
  latency (the caller's deadline was too short for any backend) is the same; after longer, it is a failure.
- **pushback.** A failed call whose trailers carry ``grpc-retry-pushback-ms`` (gRFC A6) with a non-negative value
  marks the backend as asking for no calls for that long: a comparison prefers any backend that did not.

``Outcome.pushback`` carries the parsed trailer (``pushback_of``); the client's retries read it too (A6: a
non-negative value replaces the backoff, a negative or malformed one stops the retries).

Thread safety: a ``BackendFailures`` is updated under its policy's lock (the same lock as its in-flight count).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any

import grpc

from .base import Outcome
from .stats import is_failure

__all__ = ["FAILURE_MEMORY", "FAILURE_WEIGHT", "PUSHBACK_KEY", "PUSHBACK_STOP", "BackendFailures", "Verdict",
           "prefer_second", "pushback_of"]

FAILURE_WEIGHT = 10.0  # in-flight units a failure adds (dialogue's FAILURE_WEIGHT)
FAILURE_MEMORY = 10.0  # seconds: the penalty's time constant (it fades as exp(-t / FAILURE_MEMORY))
REQUEST_ERROR_WEIGHT = FAILURE_WEIGHT / 10  # in-flight units a request error adds
TRIAL_INTERVAL = 1.0  # seconds: the wait before a penalised backend's first trial call
MAX_TRIAL_INTERVAL = 16.0  # seconds: ... and the longest
MAX_STREAK = 5  # failures in a row beyond this add no more than FAILURE_WEIGHT * 2**MAX_STREAK each
USUAL_WEIGHT = 0.2  # weight of a new success in the usual-latency average (deadline classification)
PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: ``pushback_of``'s value for a negative or malformed ``grpc-retry-pushback-ms``: the server says "do not retry"
PUSHBACK_STOP = -1.0


class Verdict(enum.Enum):
    """What a call's end says about its backend."""

    ANSWER = "answer"  # the backend answered OK
    REJECTED = "rejected"  # the backend answered with a code about the request (INVALID_ARGUMENT, NOT_FOUND, ...)
    FAILURE = "failure"  # the backend is in trouble
    NEUTRAL = "neutral"  # the caller ended it (cancelled, or a deadline below the backend's usual latency)


def pushback_of(metadata: Iterable[tuple[str, Any]] | None) -> float | None:
    """The ``grpc-retry-pushback-ms`` of trailing ``metadata`` in seconds: None when absent, ``PUSHBACK_STOP`` when
    negative or not a 32-bit integer (gRFC A6: both mean "do not retry")."""
    if not metadata:
        return None
    for key, value in metadata:
        if key != PUSHBACK_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        try:
            ms = int(text.strip())
        except ValueError:
            return PUSHBACK_STOP
        return PUSHBACK_STOP if not 0 <= ms < 2**31 else ms / 1000.0  # A6: a signed 32-bit integer
    return None


class BackendFailures:
    """The failure state of one backend; the owning policy calls ``picked`` and ``ended`` under its lock and reads
    ``penalty``, ``silence`` and ``pushed_back`` in its comparison."""

    __slots__ = ("_penalty", "_stamp", "failed_at", "pending", "picked_at", "pushback_until", "quiet_since",
                 "streak", "usual")

    def __init__(self) -> None:
        self._penalty = 0.0  # in-flight units at time _stamp
        self._stamp = 0.0
        self.streak = 0  # failures since the last fresh answer
        self.failed_at = -math.inf  # clock of the last failure
        self.pending = 0  # calls picked since the last answer
        self.picked_at = -math.inf  # clock of the last pick
        self.quiet_since: float | None = None  # when the second of those was picked (see the module doc)
        self.pushback_until = -math.inf
        self.usual: float | None = None  # seconds: average latency of the answers

    # ---- the done hook's side ----------------------------------------------------------------------

    def picked(self, now: float) -> None:
        """A call was sent here at ``now``."""
        self.picked_at = now
        self.pending += 1
        if self.pending == 2:
            self.quiet_since = now

    def verdict(self, outcome: Outcome) -> Verdict:
        """What ``outcome`` says about this backend (see the module doc)."""
        code = outcome.code
        if code is grpc.StatusCode.CANCELLED:
            return Verdict.NEUTRAL
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            usual = self.usual
            return Verdict.NEUTRAL if usual is not None and outcome.latency < usual else Verdict.FAILURE
        if code is grpc.StatusCode.OK:
            return Verdict.ANSWER
        return Verdict.FAILURE if is_failure(code) else Verdict.REJECTED

    def ended(self, outcome: Outcome, now: float, inflight: int) -> Verdict:
        """A call sent here ended with ``outcome`` at ``now``, leaving ``inflight`` calls here: update the state and
        return the verdict (the policy samples the latency of an ``ANSWER``, of a ``REJECTED`` only when it raises
        its estimate, of a ``FAILURE`` never)."""
        verdict = self.verdict(outcome)
        if verdict is Verdict.NEUTRAL:  # not an answer, but one call fewer outstanding since the last answer
            self.pending = 0 if inflight <= 0 else max(0, self.pending - 1)
            if self.pending < 2:
                self.quiet_since = None
            return verdict
        self.pending, self.quiet_since = 0, None
        sent = now - max(0.0, outcome.latency)
        if verdict is Verdict.FAILURE:
            if self.streak == 0 or sent >= self.failed_at:  # a new chance failed; not one more of a burst in flight
                self.streak += 1
            self._penalty = self.penalty(now) + FAILURE_WEIGHT * 2 ** min(self.streak - 1, MAX_STREAK)
            self._stamp = now
            self.failed_at = now
            pushback = outcome.pushback
            if pushback is not None and pushback >= 0.0:
                self.pushback_until = max(self.pushback_until, now + pushback)
            return verdict
        if verdict is Verdict.REJECTED:
            self._penalty = self.penalty(now) + REQUEST_ERROR_WEIGHT
            self._stamp = now
            return verdict
        lat = max(0.0, outcome.latency)
        self.usual = lat if self.usual is None else self.usual + USUAL_WEIGHT * (lat - self.usual)
        if sent >= self.failed_at:  # sent after the last failure: the backend works now
            self._penalty, self.streak = 0.0, 0
        return verdict

    # ---- the comparison's side ---------------------------------------------------------------------

    def penalty(self, now: float) -> float:
        """In-flight units this backend's recent failures add to its load now."""
        p = self._penalty
        if p == 0.0:
            return 0.0
        return p * math.exp(-max(0.0, now - self._stamp) / FAILURE_MEMORY)

    def trial_due(self, now: float) -> bool:
        """Whether this penalised backend has waited long enough for a trial call (see the module doc)."""
        streak = self.streak
        if streak == 0 or self.pushed_back(now):
            return False
        wait = min(MAX_TRIAL_INTERVAL, TRIAL_INTERVAL * 2 ** min(streak - 1, 10))
        return now - max(self.picked_at, self.failed_at) >= wait

    def silence(self, now: float) -> float:
        """Seconds a call has been outstanding here without any answer since it was sent (0: none); a lower bound
        of this backend's latency now."""
        q = self.quiet_since
        return 0.0 if q is None else max(0.0, now - q)

    def pushed_back(self, now: float) -> bool:
        """Whether the backend asked (``grpc-retry-pushback-ms``) for no calls until after ``now``."""
        return now < self.pushback_until

    def troubled(self, now: float, latency: float | None = None) -> bool:
        """Whether this backend should not be chosen on other signals alone (prequal's pool, least_request's draw of
        one backend twice): pushed back, a failure penalty of a call or more, or silent for longer than twice
        ``latency`` (the policy's estimate; None: the average latency of its answers here, if any)."""
        if self.pushed_back(now) or self.penalty(now) >= 1.0:
            return True
        s = self.silence(now)
        if latency is None:
            latency = self.usual
        return s > 0.0 and latency is not None and s > 2.0 * latency


def prefer_second(first: BackendFailures, second: BackendFailures, now: float) -> bool | None:
    """What decides a comparison before load: a trial that is due (take that one), else pushback (take the one that
    did not push back). True: take ``second``; False: take ``first``; None: compare the loads."""
    if first.trial_due(now):
        return False
    if second.trial_due(now):
        return True
    a, b = first.pushed_back(now), second.pushed_back(now)
    if a == b:
        return None
    return a
