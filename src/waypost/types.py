"""Value types shared across layers: what resolvers and discovery produce and what the client reads,
and the connectivity states that the client, the channels and the metrics name.

This module sits at the bottom of waypost's layers (it imports nothing from waypost), so a resolver
or a registry subscriber can build ``Backend`` values without depending on the load balancer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend address as the resolver produced it, with its registration metadata."""

    address: str
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __hash__(self) -> int:
        return hash(self.address)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and other.address == self.address and dict(
            other.metadata
        ) == dict(self.metadata)


# Connectivity states of a backend (and of a channel, aggregated), numbered as gRPC's
# ``grpc_connectivity_state`` and ``grpc.ChannelConnectivity`` are.
IDLE, CONNECTING, READY, TRANSIENT_FAILURE, SHUTDOWN = range(5)
#: gRPC call metadata as waypost reads it: (key, value) pairs, bytes for a ``-bin`` key
CallMetadata: TypeAlias = Sequence[tuple[str, str | bytes]]

STATE_NAMES = ("IDLE", "CONNECTING", "READY", "TRANSIENT_FAILURE", "SHUTDOWN")
