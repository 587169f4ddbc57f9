"""Parsing of ``methodConfig[].hedgingPolicy`` into a ``HedgingPolicy`` (see ``model``).

gRFC A6's fields mean what they mean to grpc-java: ``maxAttempts`` (2 or more, capped at 5), ``hedgingDelay``
(a duration, "0s" when left out: every attempt at once) and ``nonFatalStatusCodes`` (A6 calls it required;
grpc-java, and so waypost, reads a missing list as empty, so grpc-java's own example config parses unchanged).
waypost adds, under names A6 does not use: ``"hedgingDelay": "p95"`` (a quantile of the method's recent
latency on this channel), ``minHedgingDelay`` and ``fallbackHedgingDelay`` (its floor, and the delay used
until enough latencies are known) and ``maxExtraShare`` (hedges as a share of calls, 0.05 by default).
"""

from __future__ import annotations

import re

import grpc

from ..durations import parse_config_duration
from ..errors import describe_value
from .fields import check_fields, fail, number
from .model import HedgingPolicy
from .retry import max_attempts, status_codes

_FIELDS = ("maxAttempts", "hedgingDelay", "nonFatalStatusCodes", "maxExtraShare", "minHedgingDelay",
           "fallbackHedgingDelay")
_ADAPTIVE_ONLY = ("minHedgingDelay", "fallbackHedgingDelay")

#: hedges at most this share of a channel's calls of hedged methods, unless ``maxExtraShare`` says otherwise
DEFAULT_MAX_EXTRA_SHARE = 0.05
#: ``"hedgingDelay": "pNN"``: never below this (a quantile of very fast calls would hedge nearly at once)
DEFAULT_MIN_DELAY = 0.001
#: ``"hedgingDelay": "pNN"``: the delay until the channel knows enough of the method's latencies
DEFAULT_FALLBACK_DELAY = 0.1

_QUANTILE = re.compile(r"p(\d{1,2}(?:\.\d{1,3})?)")


def parse_hedging_policy(value: object, path: str) -> HedgingPolicy:
    if not isinstance(value, dict):
        fail(path, f"expected an object, got {describe_value(value)}")
    check_fields(value, path, _FIELDS, ())
    if "maxAttempts" not in value:
        fail(f"{path}.maxAttempts", "missing (a hedgingPolicy needs maxAttempts: the copies of a call, the first "
             "one included, 2 or more)")
    attempts = max_attempts(value["maxAttempts"], f"{path}.maxAttempts")
    delay, quantile = _delay(value.get("hedgingDelay", "0s"), f"{path}.hedgingDelay")
    if quantile is None:
        for name in _ADAPTIVE_ONLY:
            if name in value:
                fail(f"{path}.{name}", 'applies only to an adaptive delay ("hedgingDelay": "p95"); remove it or '
                     "make hedgingDelay a quantile")
    min_delay = DEFAULT_MIN_DELAY
    if "minHedgingDelay" in value:
        min_delay = parse_config_duration(value["minHedgingDelay"], f"{path}.minHedgingDelay")
    fallback = max(DEFAULT_FALLBACK_DELAY, min_delay)
    if "fallbackHedgingDelay" in value:
        fallback = parse_config_duration(value["fallbackHedgingDelay"], f"{path}.fallbackHedgingDelay")
    codes: frozenset[grpc.StatusCode] = frozenset()
    if "nonFatalStatusCodes" in value:
        codes = status_codes(value["nonFatalStatusCodes"], f"{path}.nonFatalStatusCodes", allow_empty=True,
                             what="non-fatal status code", why_not_ok="an OK answer always ends a hedged call")
    share = DEFAULT_MAX_EXTRA_SHARE
    if "maxExtraShare" in value:
        share_path = f"{path}.maxExtraShare"
        limit = attempts - 1
        share = number(value["maxExtraShare"], share_path, f"a number in [0, {limit}]")
        if not 0 <= share <= limit:
            fail(share_path, f"expected a number in [0, {limit}] (hedges per call at most: maxAttempts - 1), "
                 f"got {describe_value(share)}")
    return HedgingPolicy(max_attempts=attempts, delay=delay, non_fatal_status_codes=codes, delay_quantile=quantile,
                         min_delay=min_delay, fallback_delay=fallback, max_extra_share=float(share))


def _delay(value: object, path: str) -> tuple[float, float | None]:
    """(fixed delay, quantile): a gRPC JSON duration >= 0s, or "pNN" (50 <= NN < 100) for the adaptive delay."""
    if isinstance(value, str):
        m = _QUANTILE.fullmatch(value.strip())
        if m is not None:
            q = float(m.group(1))
            if not 50 <= q < 100:
                fail(path, f'expected a quantile from "p50" to "p99.999", got {value!r}')
            return 0.0, q / 100
        if value.strip()[:1] in ("p", "P"):
            fail(path, f'expected a quantile like "p95" (p50 to p99.999) or a duration like "0.05s", got {value!r}')
    return parse_config_duration(value, path), None
