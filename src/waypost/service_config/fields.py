"""Field checks shared by the service-config parsers; every failure is an ``InvalidServiceConfig``
whose message starts with the JSON path of the field."""

from __future__ import annotations

import math
from typing import Any, NoReturn

from ..balancer import config_fields
from ..balancer.config_fields import first_unknown
from ..durations import parse_config_duration
from ..errors import InvalidServiceConfig, describe_value

_UNSUPPORTED_WHY = {
    "maxRequestMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_send_message_length channel option",
    "maxResponseMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_receive_message_length channel option",
    "perAttemptRecvTimeout": "per-attempt receive timeouts are not supported by waypost",
}


def fail(path: str, message: str) -> NoReturn:
    raise InvalidServiceConfig(f"{path}: {message}" if path else message)


def check_fields(obj: dict[str, Any], path: str, known: tuple[str, ...], unsupported: tuple[str, ...]) -> None:
    """Raise for the first field of ``obj`` not in ``known``: the policies' check (``balancer.config_fields``),
    with an explanation instead for a gRPC field waypost knows but does not support (``unsupported``)."""
    name = first_unknown(obj, known)
    if name is not None and name in unsupported:
        fail(f"{path}.{name}" if path else name,
             _UNSUPPORTED_WHY.get(name, "a gRPC service-config field waypost does not support") + " (remove it)")
    config_fields.check_fields(obj, path, known)


def number(value: object, path: str, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(path, f"expected {expected}, got {describe_value(value)}")
    if not math.isfinite(value):
        fail(path, f"expected {expected}, got {value}")
    return value


def positive_number(value: object, path: str) -> float:
    checked = number(value, path, "a number > 0")
    if checked <= 0:
        fail(path, f"expected a number > 0, got {describe_value(checked)}")
    return float(checked)


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        fail(path, f"expected true or false, got {describe_value(value)}")
    return value


def duration(value: object, path: str) -> float:
    """A duration that must be > 0s (timeouts, backoffs)."""
    return parse_config_duration(value, path, positive=True)
