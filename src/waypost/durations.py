"""gRPC JSON duration strings ("1.5s", "0.000001s") -> seconds: the one duration parser of waypost.

This is the protobuf JSON mapping of ``google.protobuf.Duration`` that gRPC service configs use (method
timeouts, retry backoffs, outlier_detection intervals): an integer number of seconds, an optional
fraction of 1 to 9 digits, then a mandatory ``s``. Nothing else is accepted (no "100ms", no "1m", no
exponent, no bare number), so a unit typo is an error rather than a silently different timeout.
Config fields go through ``parse_config_duration``, which reports ``"<json path>: <message>"``.
"""

from __future__ import annotations

import re

from .errors import InvalidServiceConfig, describe_value

#: protobuf's Duration range: +-10,000 years
MAX_DURATION_SECONDS = 315_576_000_000

_DURATION = re.compile(r"(-)?([0-9]+)(?:\.([0-9]{1,9}))?s")


class DurationError(ValueError):
    """A string is not a valid gRPC JSON duration; the message says what is expected."""


def parse_duration(text: object) -> float:
    """Parse a gRPC JSON duration such as ``"0.1s"`` into seconds (may be zero or negative).

    Raises ``DurationError`` (a ``ValueError``) with a short description of the problem.
    """
    if not isinstance(text, str):
        raise DurationError(f'expected a duration string like "1.5s", got {describe_value(text)}')
    match = _DURATION.fullmatch(text)
    if match is None:
        raise DurationError(f'expected a duration string like "1.5s" (seconds with an "s" suffix), got {text!r}')
    sign, whole, frac = match.groups()
    # Bound the digit count before int() so huge strings cannot be slow or trip int limits.
    if len(whole.lstrip("0")) > len(str(MAX_DURATION_SECONDS)) or int(whole) > MAX_DURATION_SECONDS:
        raise DurationError(f"duration {text!r} is out of range (at most {MAX_DURATION_SECONDS}s)")
    nanos = int((frac or "").ljust(9, "0")) if frac else 0
    seconds = int(whole) + nanos / 1e9
    return -seconds if sign else seconds


def parse_positive_duration(text: object) -> float:
    """Like ``parse_duration`` but the duration must be greater than zero."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise DurationError(f"expected a duration > 0s, got {text!r}")
    return seconds


def parse_nonnegative_duration(text: object) -> float:
    """Like ``parse_duration`` but the duration must not be negative."""
    seconds = parse_duration(text)
    if seconds < 0:
        raise DurationError(f"expected a duration >= 0s, got {text!r}")
    return seconds


def parse_config_duration(value: object, path: str, *, positive: bool = False) -> float:
    """A duration field of a service config: ``>= 0s`` (``> 0s`` with ``positive``), or
    ``InvalidServiceConfig`` reading ``"<path>: <what parse_duration says>"``."""
    try:
        return parse_positive_duration(value) if positive else parse_nonnegative_duration(value)
    except DurationError as exc:
        raise InvalidServiceConfig(f"{path}: {exc}") from None


def format_duration(seconds: float) -> str:
    """The canonical gRPC JSON form of ``seconds`` (up to nanosecond precision)."""
    nanos_total = round(seconds * 1e9)
    sign = "-" if nanos_total < 0 else ""
    whole, nanos = divmod(abs(nanos_total), 1_000_000_000)
    if nanos == 0:
        return f"{sign}{whole}s"
    return f"{sign}{whole}.{nanos:09d}".rstrip("0") + "s"
