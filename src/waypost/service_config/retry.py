"""Parsing of ``methodConfig[].retryPolicy`` and ``retryThrottling`` into plain values (see ``model``)."""

from __future__ import annotations

import logging

import grpc

from ..errors import describe_value, did_you_mean, warn_config
from .fields import check_fields, duration, fail, number, positive_number
from .model import RetryPolicy, RetryThrottling

log = logging.getLogger("waypost.service_config")

#: gRPC caps retryPolicy.maxAttempts at 5 (larger values are accepted and lowered)
MAX_ATTEMPTS_CAP = 5
#: gRPC's upper bound for retryThrottling.maxTokens
MAX_TOKENS_LIMIT = 1000

#: backoff of the ``dial(retries=N)`` shortcut: uniform(0, min(0.05 s * 2^(n-1), 1 s)) before retry n
SHORTCUT_INITIAL_BACKOFF = 0.05
SHORTCUT_MAX_BACKOFF = 1.0

_RETRY_FIELDS = ("maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes")
_RETRY_UNSUPPORTED = ("perAttemptRecvTimeout",)
_THROTTLE_FIELDS = ("maxTokens", "tokenRatio")

_CODES_BY_NAME = {code.name: code for code in grpc.StatusCode}
_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def max_attempts(attempts: object, path: str) -> int:
    """A retry or hedging policy's ``maxAttempts``: an integer >= 2, lowered to gRPC's cap."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 2:
        fail(path, f"expected an integer >= 2, got {describe_value(attempts)}")
    if attempts > MAX_ATTEMPTS_CAP:
        log.debug("%s: %d capped at %d as gRPC does", path, attempts, MAX_ATTEMPTS_CAP)
    return min(attempts, MAX_ATTEMPTS_CAP)


def parse_retry_policy(value: object, path: str) -> RetryPolicy:
    if not isinstance(value, dict):
        fail(path, f"expected an object, got {describe_value(value)}")
    check_fields(value, path, _RETRY_FIELDS, _RETRY_UNSUPPORTED)
    for name in _RETRY_FIELDS:
        if name not in value:
            fail(f"{path}.{name}", "missing (a retryPolicy needs maxAttempts, initialBackoff, maxBackoff, "
                  "backoffMultiplier and retryableStatusCodes)")
    attempts = max_attempts(value["maxAttempts"], f"{path}.maxAttempts")
    initial = duration(value["initialBackoff"], f"{path}.initialBackoff")
    maximum = duration(value["maxBackoff"], f"{path}.maxBackoff")
    multiplier = positive_number(value["backoffMultiplier"], f"{path}.backoffMultiplier")
    codes = status_codes(value["retryableStatusCodes"], f"{path}.retryableStatusCodes")
    if grpc.StatusCode.UNAVAILABLE not in codes:
        names = ", ".join(sorted(c.name for c in codes))
        warn_config(f"waypost: service config: {path}.retryableStatusCodes: [{names}] lacks UNAVAILABLE: retries "
                    "will not move a call off a dead backend (a backend that is down or restarting fails calls "
                    "with UNAVAILABLE)")
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=initial,
        max_backoff=maximum,
        backoff_multiplier=multiplier,
        retryable_status_codes=codes,
    )


def shortcut_retry_policy(retries: object) -> RetryPolicy | None:
    """The retryPolicy of ``dial(retries=N)``: N retries (maxAttempts N+1, capped at 5 attempts as gRPC
    does) on UNAVAILABLE, backoff 0.05s doubling to 1s. 0 or None: no policy."""
    if retries is None:
        return None
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        fail("retries", f"expected an integer >= 0 (retries after the first attempt), got {describe_value(retries)}")
    if retries == 0:
        return None
    attempts = min(retries + 1, MAX_ATTEMPTS_CAP)
    return RetryPolicy(max_attempts=attempts, initial_backoff=SHORTCUT_INITIAL_BACKOFF,
                       max_backoff=SHORTCUT_MAX_BACKOFF, backoff_multiplier=2.0,
                       retryable_status_codes=frozenset({grpc.StatusCode.UNAVAILABLE}))


def status_codes(value: object, path: str, *, allow_empty: bool = False, what: str = "retryable status code",
                 why_not_ok: str = "retries follow failures") -> frozenset[grpc.StatusCode]:
    """A list of status codes (names or numbers); OK is refused (``what``, ``why_not_ok`` say why)."""
    if not isinstance(value, list) or (not value and not allow_empty):
        kind = "a list" if allow_empty else "a non-empty list"
        fail(path, f'expected {kind} of status codes like ["UNAVAILABLE"], got {describe_value(value)}')
    codes = set()
    for k, item in enumerate(value):
        item_path = f"{path}[{k}]"
        code: grpc.StatusCode | None
        if isinstance(item, str):
            code = _CODES_BY_NAME.get(item.upper())
            if code is None:
                fail(item_path, f"unknown status code {item!r}{did_you_mean(item.upper(), _CODES_BY_NAME)}")
        elif isinstance(item, int) and not isinstance(item, bool):
            code = _CODES_BY_NUMBER.get(item)
            if code is None:
                fail(item_path, f"unknown status code number {item} (expected 1..16)")
        else:
            fail(item_path, f'expected a status code name like "UNAVAILABLE" or a number, got {describe_value(item)}')
        if code is grpc.StatusCode.OK:
            fail(item_path, f"OK is not a {what} ({why_not_ok})")
        codes.add(code)
    return frozenset(codes)


def parse_throttling(value: object) -> RetryThrottling:
    path = "retryThrottling"
    if not isinstance(value, dict):
        fail(path, f"expected an object, got {describe_value(value)}")
    check_fields(value, path, _THROTTLE_FIELDS, ())
    for name in _THROTTLE_FIELDS:
        if name not in value:
            fail(f"{path}.{name}", "missing (retryThrottling needs maxTokens and tokenRatio)")
    max_tokens = number(value["maxTokens"], f"{path}.maxTokens", f"a number in (0, {MAX_TOKENS_LIMIT}]")
    if not 0 < max_tokens <= MAX_TOKENS_LIMIT:
        fail(f"{path}.maxTokens", f"expected a number in (0, {MAX_TOKENS_LIMIT}], got {describe_value(max_tokens)}")
    ratio = positive_number(value["tokenRatio"], f"{path}.tokenRatio")
    return RetryThrottling(max_tokens=float(max_tokens), token_ratio=float(ratio))
