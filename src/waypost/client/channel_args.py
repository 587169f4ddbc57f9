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
#:   keepalive_timeout_ms alone does not): a hung (SIGSTOPped) backend with a call in flight is detected in
#:   ~1-1.5 s instead of never/minutes. Pings are only sent while calls are active (permit_without_calls=0)
#:   and, as grpc's default ``max_pings_without_data`` = 2 is kept, at most two per burst of request data:
#:   servers' ping policing (grpc and grpc-go: a GOAWAY "too_many_pings" after 3 pings closer than 5 min with
#:   no data sent by the server in between) is not tripped by long quiet calls. Measured: unlimited pings
#:   fail a 12 s quiet call against a default grpcio server; with the default budget, 8 overlapping 10 s
#:   quiet calls pass and a SIGSTOPped server still fails the next call after 1.0 s.
#: - min_reconnect_backoff_ms 5 s: grpc's connect timeout (MIN_CONNECT_TIMEOUT, 20 s by default). A call picked in
#:   the moment its backend's connection died (before the picker dropped it) waits inside that backend channel
#:   while it reconnects; to a hung (SIGSTOPped) server TCP still connects and the HTTP/2 handshake never ends,
#:   so the call waited until its deadline (DEADLINE_EXCEEDED, not retried). With 5 s it fails UNAVAILABLE then
#:   and is retried on another backend; 5 s still leaves room for a TLS handshake over a slow link (4+ round
#:   trips of 1 s). Measured: a call to a SIGSTOPped server fails after 3.0 s with 3000, 8 s (its deadline)
#:   with the default. It does not change the reconnect backoff (``initial_reconnect_backoff_ms``).
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", 500),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.min_reconnect_backoff_ms", 5000),
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
