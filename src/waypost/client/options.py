"""Channel arguments every backend channel gets, merged with the caller's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: Why each one is here:
#: - use_local_subchannel_pool: one connection per backend channel, under our control (the global pool would
#:   share connections between channels with the same target and args).
#: - enable_retries=0: attempts are ours (retry.py moves them to another backend); native retries would stay on
#:   the same backend.
#: - keepalive 0.5 s + http2 ping timeout 1 s (the ping timeout is what actually fails a hung connection;
#:   keepalive_timeout_ms alone does not), pings without data unlimited: a hung (SIGSTOPped) backend with
#:   calls in flight is detected in ~1-1.5 s instead of never/minutes. Pings are only sent while calls are
#:   active (permit_without_calls=0), so idle connections cost nothing. Measured against default grpcio
#:   servers: quiet calls of several seconds are not refused for pinging too often.
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", 500),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 0),
)


def merge_options(user: Iterable[tuple[str, Any]] | None) -> Sequence[tuple[str, Any]]:
    """Our defaults, overridden key by key by the caller's options (kept in the caller's order)."""
    merged: dict[str, Any] = dict(DEFAULT_OPTIONS)
    for item in user or ():
        try:
            key, value = item
        except (TypeError, ValueError):
            raise ValueError(f"channel option must be a (key, value) pair, got {item!r}") from None
        merged[str(key)] = value
    # Local subchannel pool is what makes "one connection per backend" true; keep it unless overridden explicitly.
    return tuple(merged.items())
