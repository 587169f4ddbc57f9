"""Field checks shared by the service-config parsers; every failure is an ``InvalidServiceConfig``
whose message starts with the JSON path of the field."""

from __future__ import annotations

import math
from typing import Any, NoReturn

from ..durations import parse_config_duration
from ..errors import InvalidServiceConfig, describe_value, did_you_mean

_UNSUPPORTED_WHY = {
    "hedgingPolicy": "hedging is not supported by waypost; use retryPolicy",
    "maxRequestMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_send_message_length channel option",
    "maxResponseMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_receive_message_length channel option",
    "perAttemptRecvTimeout": "per-attempt receive timeouts are not supported by waypost",
}


def fail(path: str, message: str) -> NoReturn:
    raise InvalidServiceConfig(f"{path}: {message}" if path else message)


def check_fields(obj: dict[str, Any], path: str, known: tuple[str, ...], unsupported: tuple[str, ...]) -> None:
    for name in obj:
        if name in known:
            continue
        where = f"{path}.{name}" if path else name
        if name in unsupported:
            fail(where, _UNSUPPORTED_WHY.get(name, "a gRPC service-config field waypost does not support")
                  + " (remove it)")
        fail(where, f"unknown field{did_you_mean(name, known)}; expected one of: {', '.join(known)}")


def number(value: Any, path: str, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(path, f"expected {expected}, got {describe_value(value)}")
    if not math.isfinite(value):
        fail(path, f"expected {expected}, got {value}")
    return value


def positive_number(value: Any, path: str) -> float:
    checked = number(value, path, "a number > 0")
    if checked <= 0:
        fail(path, f"expected a number > 0, got {describe_value(checked)}")
    return float(checked)


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        fail(path, f"expected true or false, got {describe_value(value)}")
    return value


def duration(value: Any, path: str) -> float:
    """A duration that must be > 0s (timeouts, backoffs)."""
    return parse_config_duration(value, path, positive=True)
