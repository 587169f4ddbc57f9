"""Eureka's dial targets: ``eureka://H1:8761,H2:8761/APP`` (port default 8761; peers of one cluster: one is read,
the next when it fails). Parameters: ``path=/eureka`` (the REST API's base path), ``interval=5s`` (how often the
registry is fetched, a gRPC JSON duration), ``tls=1``."""

from __future__ import annotations

from ...durations import DurationError, parse_positive_duration
from ...resolver.target import Target, fail, parse_service_target
from .kind import KIND


def parse_eureka_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """The hosts-and-service grammar of every kind holding instances, plus checks of ``interval=`` and ``path=``."""
    for name, value in params.items():
        if name == "interval":
            try:
                parse_positive_duration(value)
            except DurationError as e:
                fail(scheme, raw, f"interval={value!r}: {e}")
        elif name == "path" and (not value.startswith("/") or any(c in value for c in "?#% ")):
            fail(scheme, raw, f"path={value!r} must be a URL path starting with '/' (e.g. path=/eureka)")
    return parse_service_target(KIND, authority, path, params, raw)
