"""Subsetting: each client talks to at most ``size`` backends (default 32, as go-zero).

Two modes:
- **stable** (default): rendezvous hashing. Every backend gets a score ``hash(client_seed, address)`` and
  the client keeps the ``size`` best. A backend joining changes at most one slot (it enters only if it
  beats the current worst member, which it replaces); a backend leaving frees one slot, taken by the best
  remaining non-member. Nothing else moves, unlike go-zero's shuffle-and-truncate on every update. With a
  random seed per client, clients spread over backends uniformly in expectation.
- **deterministic** (``client_id`` given): the SRE book's deterministic subsetting ("Site Reliability
  Engineering", ch. 20). Backends are sorted; clients are grouped in rounds of ``n // size`` clients; each
  round shuffles the backend list with the round number as seed and gives client ``i`` of the round the
  ``i``-th slice. Every backend is used by the same number of clients (+-1) whatever the client count.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import mmh3

from ..types import Backend

DEFAULT_SUBSET_SIZE = 32


class Subsetter:
    """Picks the subset of backends one client connects to. The input order is kept in the output."""

    def __init__(self, size: int = DEFAULT_SUBSET_SIZE, *, client_id: int | str | None = None,
                 seed: int | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"subset size must be an integer >= 1, got {size!r}")
        self.size = size
        self.client_id = _client_index(client_id) if client_id is not None else None
        # Only the stable mode uses the seed; 32 bits are what mmh3 takes.
        self.seed = (seed if seed is not None else random.SystemRandom().getrandbits(32)) & 0xFFFFFFFF

    def select(self, backends: Sequence[Backend]) -> list[Backend]:
        if len(backends) <= self.size:
            return list(backends)
        if self.client_id is not None:
            chosen = set(deterministic_subset([b.address for b in backends], self.client_id, self.size))
        else:
            ranked = sorted(backends, key=self._score)
            chosen = {b.address for b in ranked[: self.size]}
        return [b for b in backends if b.address in chosen]

    def _score(self, b: Backend) -> tuple[int, str]:
        return mmh3.hash64(b.address, seed=self.seed, signed=False)[0], b.address


def deterministic_subset(addresses: Sequence[str], client_id: int, size: int) -> list[str]:
    """The SRE book's algorithm: the subset of ``addresses`` for client number ``client_id``."""
    backends = sorted(set(addresses))
    if len(backends) <= size:
        return backends
    subset_count = len(backends) // size
    round_ = client_id // subset_count
    random.Random(round_).shuffle(backends)
    subset_id = client_id % subset_count
    start = subset_id * size
    return backends[start: start + size]


def _client_index(client_id: int | str) -> int:
    if isinstance(client_id, bool):
        raise TypeError("client_id must be a non-negative integer (or a string of digits)")
    if isinstance(client_id, str):
        if not client_id.isdigit():
            raise ValueError(f"client_id must be a non-negative integer (e.g. a pod ordinal), got {client_id!r}")
        client_id = int(client_id)
    if not isinstance(client_id, int) or client_id < 0:
        raise ValueError(f"client_id must be a non-negative integer, got {client_id!r}")
    return client_id
