"""direct:///a:1,b:2 (and ipv4:/ipv6:/plain host:port): a fixed address list."""

from __future__ import annotations

from ..types import Backend
from .base import OnError, OnUpdate, ResolverOptions
from .target import Target


class DirectResolver:
    """Reports the target's addresses once; nothing to watch, nothing to re-resolve."""

    def __init__(self, target: Target, options: ResolverOptions | None = None) -> None:
        self.target = target

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        on_update([Backend(a) for a in self.target.endpoints])

    def resolve_now(self, reason: str) -> None:
        """A fixed list: nothing to re-read."""

    def close(self) -> None:
        """Nothing to release."""

    async def aclose(self) -> None:
        """Nothing to release."""
