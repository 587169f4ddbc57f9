"""direct:///a:1,b:2 (and ipv4:/ipv6:/plain host:port): a fixed address list."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..types import Backend
from .target import Target


class DirectResolver:
    """Reports the target's addresses once; nothing to watch."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def start(self, on_update: Callable[[Sequence[Backend]], None], on_error: Callable[[str], None]) -> None:
        on_update([Backend(a) for a in self.target.endpoints])

    def close(self) -> None:
        return None
