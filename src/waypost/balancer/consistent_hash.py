"""consistent_hash: go-zero's hash ring, so the same key reaches the same address as a Go client.

Origin: go-zero ``core/hash`` + ``zrpc/internal/balancer/consistenthash``. 100 virtual nodes per
address at ``murmur3_64(addr + str(i))`` (no separator); murmur3 is the x64 128-bit variant's first
64 bits with seed 0 (``mmh3.hash64(data, seed=0, x64arch=True)[0]`` as unsigned), as go-zero's
``hash.Hash``. A key goes to the first ring point >= its hash, wrapping around. Points shared by
several addresses (64-bit collisions) are split by ``hash("16777619:" + key)``, as go-zero does.

The key is ``PickInfo.hash_key`` (set with ``waypost.hash_key(...)``), else the value of the request
header named by the ``hashHeader`` option. No key fails the call with INVALID_ARGUMENT and go-zero's
message. The ring is rebuilt only when the address set changes; removing or adding one of N
addresses moves about 1/N of the keys.

Weighted ring (``{"consistent_hash": {"weighted": true}}``, off by default, not in go-zero): an address gets
as many virtual nodes as its registration weight (``weights.weight_of``: missing = 100, so an unweighted
fleet's ring is go-zero's point for point), at most ``MAX_WEIGHTED_REPLICAS``; weight 0 (drained) gives it
none, so its keys go to the others; every backend drained fails the call with UNAVAILABLE as
smooth_weighted_round_robin does. Virtual node ``i`` is at ``murmur3_64(addr + str(i))`` as before, so changing one
weight from 100 to 150 adds 50 points of that address: only the keys those points take move (to it).

Thread safety: rings and pickers are immutable; ``pick`` takes no lock.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import mmh3

from ..errors import InvalidServiceConfig, NoBackendAvailable
from ..types import Backend
from .base import Picker, PickError, PickInfo, PickResult, Policy, key_bytes
from .config_fields import policy_config
from .stats import dedupe
from .weights import WeightMemo, all_drained

log = logging.getLogger("waypost.balancer.consistent_hash")

REPLICAS = 100
#: the most virtual nodes one address gets on a weighted ring (weight 10,000: 100 times the default)
MAX_WEIGHTED_REPLICAS = 10_000
_PRIME = 16777619
_U64 = (1 << 64) - 1
MISSING_KEY_MESSAGE = "[consistent_hash] missing hash key in context"


def hash64(data: bytes) -> int:
    """go-zero's ``hash.Hash``: murmur3 x64_128, first 64 bits, seed 0, unsigned."""
    return mmh3.hash64(data, seed=0, x64arch=True)[0] & _U64


class HashRing:
    """An immutable ring of ``REPLICAS`` points per address (``replicas_of``: that many for an address)."""

    def __init__(self, addresses: Sequence[str], replicas: int = REPLICAS,
                 replicas_of: Mapping[str, int] | None = None) -> None:
        owners: dict[int, list[str]] = {}
        for addr in sorted(set(addresses)):
            count = replicas if replicas_of is None else replicas_of.get(addr, replicas)
            for i in range(count):
                owners.setdefault(hash64((addr + str(i)).encode()), []).append(addr)
        self._points = sorted(owners)
        self._owners = {h: tuple(a) for h, a in owners.items()}

    def __len__(self) -> int:
        return len(self._points)

    def get(self, key: str) -> str | None:
        """The address owning ``key``, or None when the ring is empty."""
        if not self._points:
            return None
        idx = bisect.bisect_left(self._points, hash64(key_bytes(key))) % len(self._points)
        owners = self._owners[self._points[idx]]
        if len(owners) == 1:
            return owners[0]
        return owners[hash64(key_bytes(f"{_PRIME}:{key}")) % len(owners)]


class ConsistentHashPicker(Picker):
    def __init__(self, ring: HashRing, backends: Sequence[Backend], header: str | None) -> None:
        self._ring = ring
        self._results = {b.address: PickResult(b) for b in backends}
        self._header = header
        self._all_drained = len(ring) == 0 and bool(backends)  # weighted: every backend has weight 0

    def _key(self, info: PickInfo) -> str | None:
        if info.hash_key:
            return info.hash_key
        if self._header is not None:
            for name, value in info.metadata:
                if name.lower() == self._header:
                    if isinstance(value, bytes):
                        value = value.decode("utf-8", "surrogateescape")
                    if value:
                        return value
        return None

    def pick(self, info: PickInfo) -> PickResult:
        if not self._results:
            raise NoBackendAvailable("consistent_hash: no READY backend")
        key = self._key(info)
        if key is None:
            raise PickError(grpc.StatusCode.INVALID_ARGUMENT, MISSING_KEY_MESSAGE)
        if self._all_drained:
            raise all_drained(ConsistentHashPolicy.name, len(self._results))
        addr = self._ring.get(key)
        if addr is None:  # unreachable: the ring holds exactly the picker's addresses
            raise NoBackendAvailable("consistent_hash: empty ring")
        return self._results[addr]


class ConsistentHashPolicy(Policy):
    """Route each hash key to the same backend via go-zero's ring (100 virtual nodes, murmur3)."""

    name = "consistent_hash"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        header = self.config.get("hashHeader")
        self._header = header.lower() if isinstance(header, str) and header else None
        self.weighted = bool(self.config.get("weighted", False))
        self._ring_addrs: frozenset[str] | frozenset[tuple[str, int]] | None = None
        self._ring = HashRing(())
        self._weights = WeightMemo(log)

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        cfg = policy_config(raw, path, cls.name, ("hashHeader", "weighted"))
        if "hashHeader" in cfg:
            h = cfg["hashHeader"]
            if not isinstance(h, str) or not h or h != h.strip() or h.startswith(":"):
                raise InvalidServiceConfig(
                    f"{path}.hashHeader: expected a non-empty header name (not a pseudo-header), got {h!r}"
                )
        if "weighted" in cfg and not isinstance(cfg["weighted"], bool):
            raise InvalidServiceConfig(f"{path}.weighted: expected true or false, got {cfg['weighted']!r}")
        return cfg

    def build(self, backends: Sequence[Backend]) -> Picker:
        backends = dedupe(backends)
        if self.weighted:
            replicas = self._replicas(backends)
            points = frozenset(replicas.items())
            if points != self._ring_addrs:
                self._ring = HashRing(sorted(replicas), replicas_of=replicas)
                self._ring_addrs = points
            return ConsistentHashPicker(self._ring, backends, self._header)
        addrs = frozenset(b.address for b in backends)
        if addrs != self._ring_addrs:
            self._ring = HashRing(sorted(addrs))
            self._ring_addrs = addrs
        return ConsistentHashPicker(self._ring, backends, self._header)

    def _replicas(self, backends: Sequence[Backend]) -> dict[str, int]:
        """address -> virtual nodes (its weight, capped; 0 drained), a bad weight logged once per value."""
        return {a: min(w, MAX_WEIGHTED_REPLICAS) for a, w in self._weights.update(backends).items()}
