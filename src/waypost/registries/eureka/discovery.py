"""eureka://HOST:8761[,HOST2:8761]/APP: the UP instances of an Eureka application, read as Eureka's own client does.

1. a full fetch (``GET /eureka/apps``) fills a copy of the registry (``apps.RegistryCopy``); then every ``interval``
   s a delta (``GET /eureka/apps/delta``) is applied to it, and a copy whose reconcile hash code differs from the
   answer's ``apps__hashcode`` (a change older than the delta window, a server restarted empty, a failover to a
   peer that differs) fetches everything again; after a failure the next fetch is a full one;
2. the backends: the app's UP instances (an operator's status override drains one), ``ipAddr`` and metadata
   ``gRPC_port`` when it is a port number, else ``port``; their metadata decoded; sorted, one per address;
   malformed instances are skipped, each distinct problem logged once;
3. an empty list from a full fetch while there were instances (after an outage or a hash mismatch: a server
   restarted empty lacks every instance until its next heartbeat) is held for ``settle`` s unless an instance
   comes back; removals seen in a delta apply at once.

Until the first answer the servers share ``FIRST_TIMEOUT``, so that a blocking dial's error names each one's fate.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from ... import urlparams
from ...backoff import cool_down
from ...kinds import Backend, InvalidTarget, PollingDiscovery, RegistryUnavailable, Target
from ...resolver.read_failure import failure_text
from ..http_kind import ProblemsSaid, logged_hold
from .api import EurekaClient, EurekaUnreachable
from .apps import RegistryCopy, applications
from .config import DEFAULT_INTERVAL, DEFAULT_PATH, EurekaConfig, app_name, parse_interval

log = logging.getLogger("waypost.resolver.eureka")

#: how long an empty list from a full fetch is held (a server restarted empty: Spring's instances renew every
#: 30 s, and register again at the first renewal it answers 404)
SETTLE = 35.0
#: each server's bound, seconds, per fetch; until the first answer, the servers share ``FIRST_TIMEOUT``
READ_TIMEOUT = 5.0
FIRST_TIMEOUT = 4.0


class EurekaDiscovery(PollingDiscovery):
    """Follows the UP instances of ``target``'s app (see the module docstring). The counters are for tests."""

    def __init__(self, target: Target) -> None:
        o = target.options
        self.config = EurekaConfig(servers=tuple(target.endpoints), path=o.get("path", DEFAULT_PATH),
                                   tls=urlparams.flag("tls", o.get("tls", "0"), InvalidTarget))
        self.app = app_name(target.key or "", InvalidTarget)
        self.interval = parse_interval(o["interval"], InvalidTarget) if "interval" in o else DEFAULT_INTERVAL
        self.min_interval = self.interval  # a failed connection changes nothing in Eureka: no extra fetch
        self.client = EurekaClient(self.config, timeout=FIRST_TIMEOUT / len(self.config.servers))
        self.copy = RegistryCopy()
        self._full_next, self._full_reason = True, "first fetch"  # the next fetch is a full one, and why
        self._last: tuple[Backend, ...] = ()
        #: the hold of an empty list from a full fetch (``hold.settle`` s; ``hold.holds``: how many so far)
        self.hold = logged_hold(SETTLE, log, lambda: f"eureka: app {self.app} has no UP instance after a full fetch "
                                f"({self._full_reason})", lambda: len(self._last))
        self._said = ProblemsSaid()  # the malformed-instance problems already logged
        self._rng = random.Random()
        self.full_fetches = self.delta_fetches = self.mismatches = self.failures = self.malformed = 0

    def __repr__(self) -> str:
        return f"<EurekaDiscovery {self.app} at {self.config.url} full={self.full_fetches} delta={self.delta_fetches}>"

    def describe(self, service: str) -> str:
        return f"app {self.app}"

    def next_interval(self) -> float:
        return cool_down(self._rng, self.interval)

    async def instances(self, service: str) -> Sequence[Backend]:
        try:
            from_full = await self._fetch()
        except Exception as e:
            self.failures += 1
            # everything again: a server may have restarted, or failed over
            self._full_next, self._full_reason = True, "after a failure"
            if isinstance(e, EurekaUnreachable):  # it says where, once
                raise
            raise RegistryUnavailable(f"eureka: reading app {self.app} at {self.config.url} failed: "
                                      f"{failure_text(e)}") from e
        self.client.timeout = READ_TIMEOUT
        backends = self._backends()
        if self.hold.hold(not backends and bool(self._last), may_start=from_full):
            return self._last
        self._last = backends
        return backends

    async def _fetch(self) -> bool:
        """One fetch into the copy; whether it was a full one."""
        problems: list[str] = []
        from_full = self._full_next or not self.copy.filled
        if from_full:
            await self._fetch_all(problems)
        else:
            apps = applications(await self.client.delta(), self.client.server)
            self.delta_fetches += 1
            self.copy.apply_delta(apps, problems)
            expected = str(apps.get("apps__hashcode", ""))
            if expected != self.copy.hashcode():
                self.mismatches += 1
                log.debug("waypost: eureka: app %s: hash code %r after the delta, the server's is %r: fetching "
                          "everything", self.app, self.copy.hashcode(), expected)
                self._full_reason = "hash code mismatch"
                await self._fetch_all(problems)
                from_full = True
        self._warn(problems)
        return from_full

    async def _fetch_all(self, problems: list[str]) -> None:
        self.copy.replace(applications(await self.client.apps(), self.client.server), problems)
        self.full_fetches += 1
        self._full_next = False

    def _warn(self, problems: list[str]) -> None:
        self.malformed += len(problems)
        for problem in self._said.new(problems):
            log.warning("waypost: eureka: skipping a malformed instance in the answer for app %s: %s", self.app, problem)

    def _backends(self) -> tuple[Backend, ...]:
        """The app's UP instances as backends (sorted by address; one per address: the first by instance id)."""
        by_address: dict[str, Backend] = {}
        for inst in self.copy.instances(self.app):
            address = inst.address
            if inst.status == "UP" and address is None:
                log.debug("waypost: eureka: skipping instance %r of app %s without a usable address", inst.id, self.app)
            elif inst.status == "UP" and address is not None:
                by_address.setdefault(address, Backend(address, dict(inst.metadata)))
        return tuple(by_address[a] for a in sorted(by_address))

    async def close(self) -> None:
        await self.client.close()
