"""What a resolver told its channel, recorded from whichever thread it calls from (tests of resolvers)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from waypost.types import Backend


class ResolverUpdates:
    """``on_update`` / ``on_error`` (also named ``update`` / ``error``) for ``resolver.start``; ``lists`` and
    ``errors`` in the order received. ``addresses()``: the last list's addresses (sorted when ``sort``)."""

    sort = False

    def __init__(self) -> None:
        self.lists: list[list[Backend]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def on_update(self, backends: Sequence[Backend]) -> None:
        with self._lock:
            self.lists.append(list(backends))

    def on_error(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    update = on_update
    error = on_error

    @property
    def last(self) -> list[Backend] | None:
        with self._lock:
            return self.lists[-1] if self.lists else None

    def addresses(self) -> list[str] | None:
        last = self.last
        if last is None:
            return None
        out = [b.address for b in last]
        return sorted(out) if self.sort else out
