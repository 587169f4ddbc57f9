"""An adaptive per-backend concurrency limit (AIMD): calls wait in the client while every backend is at its limit.

A load-aware policy sends each call to the least loaded backend it compares; when every backend fails at once
(a bad deploy, a shared dependency down) each call still goes to one of them and fails. With a limit, a backend
that fails takes fewer calls at a time, and the calls beyond every backend's limit wait in the client, as with
``wait_for_ready``, until a call ends somewhere or their deadline passes; when the backends recover, the waiting
calls go through. This is the behaviour of Palantir dialogue's per-host concurrency limiter and of Netflix
concurrency-limits' AIMD limit:

- each backend has a ``limit`` (starting at ``initial``) and its calls in flight from this client; a pick
  considers only the backends with fewer calls in flight than their limit (rounded down, at least one call);
- **additive increase**: a call that ended with an answer (OK, or a code about the request, which is an answer
  too) raises the limit by one when it used most of it: when it was sent, the backend's calls in flight, itself
  included, were at least ``backoffRatio`` x the limit. A limit nobody comes near does not grow without bound;
- **multiplicative decrease**: a failed call (``stats.FAILURE_CODES``, as ``failure.BackendFailures.verdict``
  classifies it) multiplies the limit by ``backoffRatio`` (rounded down, never below ``min``);
- **the caller's own ends do not count**: CANCELLED and a DEADLINE_EXCEEDED shorter than the backend's usual
  latency (``failure.Verdict.NEUTRAL``) only end the call;
- when every READY backend is at its limit the picker raises ``AtLimit``: the channel waits for a call to end
  (the policy's waker, ``Policy.attach_waker``) or for a new picker, bounded by the call's deadline
  (DEADLINE_EXCEEDED naming the backends' states once it passes).

Config: a field of a load-aware policy's ``loadBalancingConfig`` entry, ``{"peak_ewma": {"concurrencyLimit":
{"initial": 20, "min": 1, "max": 1000, "backoffRatio": 0.9}}}`` (every field optional, those are the defaults;
``{}`` turns it on with them). Absent: no limit.

Thread safety: a ``BackendLimit`` is read and updated under its policy's lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidServiceConfig, NoBackendAvailable
from .config_fields import check_fields
from .failure import Verdict

__all__ = ["FIELD", "AtLimit", "BackendLimit", "LimitSettings", "parse_limit", "room", "settings_of"]

FIELD = "concurrencyLimit"
DEFAULT_INITIAL = 20  # dialogue's and Netflix concurrency-limits' initial limit
DEFAULT_MIN = 1
DEFAULT_MAX = 1000
DEFAULT_BACKOFF = 0.9  # dialogue's backoff ratio (Netflix's AIMD default)
MAX_LIMIT = 1_000_000
_INT_FIELDS = ("initial", "min", "max")
FIELDS = (*_INT_FIELDS, "backoffRatio")


class AtLimit(NoBackendAvailable):
    """Every READY backend is at its concurrency limit: the call waits for one to free up (not a failure)."""


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """A validated ``concurrencyLimit``."""

    initial: int = DEFAULT_INITIAL
    min: int = DEFAULT_MIN
    max: int = DEFAULT_MAX
    backoff: float = DEFAULT_BACKOFF


def parse_limit(cfg: dict[str, Any], path: str) -> None:
    """Validate ``cfg["concurrencyLimit"]`` in place (it becomes a ``LimitSettings``) when present."""
    if FIELD not in cfg:
        return
    raw = cfg[FIELD]
    where = f"{path}.{FIELD}"
    if not isinstance(raw, Mapping):
        raise InvalidServiceConfig(f"{where}: expected a JSON object such as {{\"initial\": 20, \"min\": 1, "
                                   f"\"max\": 1000, \"backoffRatio\": 0.9}} ({{}}: those defaults), got {raw!r}")
    check_fields(raw, where, FIELDS, owner=FIELD)
    values: dict[str, int] = {}
    for name, default in zip(_INT_FIELDS, (DEFAULT_INITIAL, DEFAULT_MIN, DEFAULT_MAX), strict=True):
        v = raw.get(name, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LIMIT:
            raise InvalidServiceConfig(f"{where}.{name}: expected a whole number of calls from 1 to {MAX_LIMIT}, "
                                       f"got {v!r}")
        values[name] = v
    lo, hi, start = values["min"], values["max"], values["initial"]
    if not lo <= start <= hi:
        raise InvalidServiceConfig(f"{where}: expected min <= initial <= max, got min {lo}, initial {start}, "
                                   f"max {hi}")
    backoff = raw.get("backoffRatio", DEFAULT_BACKOFF)
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not 0.0 < backoff < 1.0:
        raise InvalidServiceConfig(f"{where}.backoffRatio: expected a number between 0 and 1 (exclusive), the "
                                   f"factor a failure multiplies the limit by, got {backoff!r}")
    cfg[FIELD] = LimitSettings(start, lo, hi, float(backoff))


def settings_of(config: Mapping[str, Any]) -> LimitSettings | None:
    """The limit of a parsed policy config; None when off. A policy built from a plain dict (tests, custom code)
    may carry the field unparsed: it is validated here."""
    raw = config.get(FIELD)
    if raw is None or isinstance(raw, LimitSettings):
        return raw
    cfg = {FIELD: raw}
    parse_limit(cfg, "concurrencyLimit config")
    out: LimitSettings = cfg[FIELD]
    return out


class BackendLimit:
    """One backend's limit and calls in flight under it (see the module doc)."""

    __slots__ = ("inflight", "limit", "settings")

    def __init__(self, settings: LimitSettings) -> None:
        self.settings = settings
        self.limit = float(settings.initial)
        self.inflight = 0

    def full(self) -> bool:
        """Whether a call sent now would exceed the limit (a limit of 4.7 admits 4 calls; at least one always)."""
        return self.inflight >= max(1, math.floor(self.limit))

    def acquire(self) -> int:
        """Count a call sent here; returns the calls in flight with it (what its end compares with the limit)."""
        self.inflight += 1
        return self.inflight

    def release(self, verdict: Verdict, sent_with: int) -> bool:
        """A call ``acquire`` counted (``sent_with``: what it returned) ended with ``verdict``: adjust the limit.
        Returns whether a call waiting for a backend under its limit may now go here (the backend was full and
        is not any more), so the policy wakes the waiting calls only then."""
        was_full = self.full()
        self.inflight = max(0, self.inflight - 1)
        s = self.settings
        if verdict is Verdict.FAILURE:
            self.limit = max(float(s.min), math.floor(self.limit * s.backoff))
        elif verdict is not Verdict.NEUTRAL and sent_with >= math.floor(self.limit * s.backoff):
            self.limit = min(float(s.max), self.limit + 1.0)
        return was_full and not self.full()


def room(limits: Sequence[BackendLimit | None], troubled: Callable[[int], bool], trial_due: Callable[[int], bool],
         who: str) -> list[int]:
    """The indices of the backends a call may go to when the policy's choice was at its limit: those under their
    limit and sound (``troubled`` False); only failing ones have room while a sound one is full: the one whose trial
    is due (``trial_due``), if any (a call waits for the sound one rather than fail); every backend failing: those
    under their limit (their limits pace the calls sent to them). Raises ``AtLimit`` (``who``: the policy, for the
    message) when that leaves none: the call waits."""
    open_ = [k for k, lim in enumerate(limits) if lim is None or not lim.full()]
    sound = [k for k in open_ if not troubled(k)]
    if sound:
        return sound
    if open_ and len(open_) < len(limits) and any(not troubled(k) for k in range(len(limits)) if k not in open_):
        open_ = [k for k in open_ if trial_due(k)][:1]
    if not open_:
        raise AtLimit(f"{who}: every READY backend ({len(limits)}) is at its concurrency limit, or failing")
    return open_
