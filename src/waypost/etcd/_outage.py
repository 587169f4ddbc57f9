"""Outage bookkeeping shared by the long-lived etcd streams (keepalive, watch).

A stream that keeps breaking during one outage must log its first failure at INFO/WARNING, the retries
at DEBUG, then exactly one "re-established after N s" line and one reconnect count when it is back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .. import metrics


class StreamOutage:
    def __init__(self, stream: str, clock: Callable[[], float], log: logging.Logger) -> None:
        self.stream = stream  # "keepalive" / "watch": log text and metric label
        self.clock = clock
        self.log = log
        self.since: float | None = None

    def levels(self) -> tuple[int, int]:
        """(info, warning) levels for a failure now: DEBUG for both while an outage is already known."""
        return (logging.INFO, logging.WARNING) if self.since is None else (logging.DEBUG, logging.DEBUG)

    def broken(self) -> None:
        """The stream just ended; the outage starts now unless one is already running."""
        if self.since is None:
            self.since = self.clock()

    def reestablished(self) -> None:
        """The stream is up again: one log line and one count per outage."""
        if self.since is None:
            return
        self.log.info("etcd %s stream re-established after %.1fs", self.stream, self.clock() - self.since)
        self.since = None
        obs = metrics.current
        if obs is not None:
            obs.registry_reconnect(self.stream)
