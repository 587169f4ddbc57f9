"""Helpers for the balancing-policy tests: backends from addresses, and a clock the test moves by hand."""

from __future__ import annotations

from collections.abc import Iterable

from waypost.types import Backend

__all__ = ["FakeClock", "bs"]


def bs(*addrs: str | Iterable[str]) -> list[Backend]:
    """Backends for addresses given one by one (``bs("a", "b")``) or as one iterable (``bs(ADDRS)``)."""
    out: list[Backend] = []
    for a in addrs:
        out.extend(Backend(x) for x in ([a] if isinstance(a, str) else a))
    return out


class FakeClock:
    """A monotonic clock for injection (``clock=``): ``clock.now`` is read and moved by the test."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
