"""Per-backend statistics shared by the policies, keyed by address so they survive picker rebuilds.

A policy owns one ``StatsTable``; each ``build`` calls ``sync(backends)``, which keeps the entries of
addresses that stay, creates fresh ones for new addresses and drops the entries of removed ones. A
``done`` hook holds a direct reference to its entry, so a call that ends after a rebuild still
updates (or harmlessly updates a dropped) entry and never leaks in-flight counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import grpc

from ..types import Backend

#: Status codes that say the backend (not the request) is in trouble; go-zero's codes.Acceptable is
#: false exactly for these. Every other code, OK included, counts as a success for load statistics.
FAILURE_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def is_failure(code: grpc.StatusCode) -> bool:
    """True when ``code`` counts against the backend's health."""
    return code in FAILURE_CODES


T = TypeVar("T")


class StatsTable(Generic[T]):
    """address -> per-backend state, created by ``factory(backend)`` on first sight.

    Not thread-safe by itself: ``sync`` is called from ``Policy.build``, which the channel serialises.
    Readers on the pick path use the list ``sync`` returned (an immutable snapshot for that picker).
    """

    def __init__(self, factory: Callable[[Backend], T]) -> None:
        self._factory = factory
        self._entries: dict[str, T] = {}

    def sync(self, backends: Sequence[Backend]) -> list[T]:
        """Entries for ``backends`` in order; entries of addresses not in ``backends`` are dropped."""
        entries: dict[str, T] = {}
        out: list[T] = []
        for b in backends:
            entry = entries.get(b.address)
            if entry is None:
                entry = self._entries.get(b.address)
                if entry is None:
                    entry = self._factory(b)
                entries[b.address] = entry
            out.append(entry)
        self._entries = entries
        return out

    def get(self, address: str) -> T | None:
        return self._entries.get(address)

    def __contains__(self, address: object) -> bool:
        return address in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def values(self) -> list[T]:
        """The entries of the latest ``sync``, in its order."""
        return list(self._entries.values())


def dedupe(backends: Sequence[Backend]) -> list[Backend]:
    """Backends with duplicate addresses removed (first one wins), order kept."""
    seen: set[str] = set()
    out: list[Backend] = []
    for b in backends:
        if b.address not in seen:
            seen.add(b.address)
            out.append(b)
    return out
