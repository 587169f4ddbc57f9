"""The server's load on every response: ``waypost-server-load`` trailing metadata, ``"<in flight> <latency>"``.

A server that accounts its calls (``LoadAccount``) adds, as each call ends, its requests in flight without that call
and its latency estimate at that load (seconds, ``-`` when it has none yet) to the call's trailing metadata. A
load-aware client policy (``prequal``) then learns a backend's load from every call it makes there, without an
extra RPC: a load-report probe costs the client about as much CPU as a call (bench/load_sweep.py --probe-cost), a
trailer read on a call it makes anyway costs a dictionary lookup and a split. ASCII, not protobuf: the trailer
rides on every call, and ``int``/``float`` parse faster than a message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

KEY = "waypost-server-load"


def encode(in_flight: int, latency: float | None) -> str:
    """The trailer's value for a server with ``in_flight`` calls and this latency estimate (seconds)."""
    return f"{in_flight} -" if latency is None else f"{in_flight} {latency:.6g}"


def decode(metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[int, float | None] | None:
    """(in flight, latency estimate or None) from a call's trailing metadata; None when absent or malformed (a
    report must never fail the call it rides on)."""
    if not metadata:
        return None
    for key, value in metadata:
        if key == KEY:
            try:
                text = value.decode("ascii") if isinstance(value, bytes) else value
                rif, lat = text.split(" ", 1)
                in_flight = int(rif)
                latency = None if lat == "-" else float(lat)
            except (ValueError, UnicodeDecodeError):
                return None
            if in_flight < 0 or (latency is not None and not (math.isfinite(latency) and latency >= 0)):
                return None
            return in_flight, latency
    return None
