"""The library's metric events, one method each (``Observer``): what ``waypost.metrics``' hooks call and what its
sinks (Prometheus, OpenTelemetry) record. Here, below every layer, so that any layer can name it."""

from __future__ import annotations

from collections.abc import Sequence

import grpc


class Observer:
    """The library's events, one method each: a sink overrides those it records (the others do nothing).

    Every hook is cheap and must never raise into the caller."""

    def call_done(self, target: str, backend: str, code: grpc.StatusCode, latency: float, method: str = "") -> None:
        """One attempt of ``method`` on ``backend`` finished with ``code`` after ``latency`` seconds."""

    def picker_rebuilt(self, target: str) -> None:
        """A new picker was built for ``target``."""

    def backend_ejected(self, backend: str, target: str = "") -> None:
        """Outlier detection ejected ``backend``."""

    def backend_removed(self, target: str, backend: str) -> None:
        """``backend`` left ``target``'s address set."""

    def wrr_scheduler_update(self, target: str, weights: Sequence[float], not_yet_usable: int, stale: int,
                             rr_fallback: bool) -> None:
        """weighted_round_robin built a scheduler for ``target`` over ``weights`` (0: no usable weight):
        ``not_yet_usable`` endpoints had no report yet or were in their blackout period, ``stale`` ones had a
        weight older than the expiration period; ``rr_fallback``: too few usable weights, plain round robin."""

    def pick_first_event(self, target: str, event: str) -> None:
        """pick_first saw a connection of ``target`` change: ``connection_attempts_succeeded``,
        ``connection_attempts_failed`` or ``disconnections`` (the backend in use lost)."""

    def resolver_update(self, target: str) -> None:
        """A channel of ``target`` received a backend list from its resolver."""

    def registry_reconnect(self, stream: str) -> None:
        """An etcd ``stream`` (``watch`` or ``keepalive``) broke and is being re-established."""

    def store_reset(self) -> None:
        """A watch stream found the etcd store gone back in time (its watches start over)."""

    def watch_reload(self, key: str, reason: str) -> None:
        """A subscriber reloaded ``key`` (reason: compacted, reset, error)."""

    def lease_reregistered(self, key: str) -> None:
        """A publisher registered ``key`` again after losing its lease."""

    def registration_restored(self, key: str) -> None:
        """A publisher put its record back after an outside delete."""

    def resolver_error(self, target: str, reason: str) -> None:
        """A resolver's read of ``target``'s source failed (``reason``: unavailable, refused, malformed,
        malformed_entry, error)."""

    def xds_stream(self, delta: int) -> None:
        """An ADS stream opened (+1) or closed (-1)."""

    def xds_push(self, type_: str) -> None:
        """An xDS response of ``type_`` was sent."""

    def xds_push_many(self, type_: str, count: int) -> None:
        """``count`` xDS responses of ``type_`` were sent (a push counts its streams' at once); by default
        ``xds_push`` that many times, so an observer that counts one at a time sees them all."""
        for _ in range(count):
            self.xds_push(type_)

    def xds_nack(self, type_: str) -> None:
        """A client rejected an xDS response of ``type_``."""

    def xds_pushed(self, seconds: float) -> None:
        """A source's change reached every stream's queue after ``seconds``."""

    def xds_resources(self, type_: str, count: int) -> None:
        """The snapshot serves ``count`` resources of ``type_``."""

    def xds_source(self, export: str, up: bool) -> None:
        """An xDS export's source answers (``up``) or fails."""
