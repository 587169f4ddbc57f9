"""eureka://HOST:8761[,HOST2:8761]/APP: the UP instances of an Eureka application, fetched every few seconds.

On the control loop, as Eureka's own client does:

1. a full fetch (``GET /eureka/apps``: every app) fills a copy of the registry (``apps.RegistryCopy``);
2. every ``interval`` s (``?interval=``, default ``config.DEFAULT_INTERVAL``) a delta fetch (``GET
   /eureka/apps/delta``: what was ADDED, MODIFIED or DELETED lately) is applied to the copy, and the copy's
   reconcile hash code is compared with the answer's ``apps__hashcode``: a mismatch (a change older than the
   server's delta window, a server restarted empty, a failover to a peer that differs) fetches everything again;
3. the app's instances whose ``status`` is UP become the backends (OUT_OF_SERVICE, DOWN, STARTING and UNKNOWN are
   left out, so an operator's status override drains an instance): ``ipAddr`` and the port from metadata
   ``gRPC_port`` when it is a port number, else ``port``; their metadata decoded (``apps.decode_metadata``:
   ``weight``, ``zone``... to the pickers). Sorted by address, one backend per address (the first by instance id);
4. no server reachable, an error answer, or an answer that is not Eureka's (no JSON, no ``applications``): the
   channel keeps the last list (``on_error`` says why, logged once per new reason) and the next fetch, after a
   backoff (0.5 s doubling up to 10 s, jittered), is a full one. Instances that are malformed beside good ones
   are skipped, each distinct problem logged once;
5. an empty list that comes from a full fetch while the list had instances (right after an outage, or after a
   hash mismatch: a server that restarted empty has lost every registration until each instance's next
   heartbeat) does not replace the list until it has stayed empty for ``settle`` s (checked at each fetch); a
   non-empty answer applies at once, and so do removals seen in a delta (an instance deleted or evicted).

Until the first list, each server is given a share of what is left of a blocking start's ``timeout``, so the
start's error names what went wrong with each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable

from ...backoff import cool_down
from ...errors import InvalidTarget
from ...resolver.base import ResolverOptions
from ...resolver.empty_hold import EmptyListHold
from ...resolver.loop_resolver import LoopResolver
from ...resolver.read_failure import failure_text
from ...resolver.target import Target
from ...types import Backend
from .api import EurekaClient, EurekaUnreachable, require_client
from .apps import RegistryCopy, applications
from .config import from_target

log = logging.getLogger("waypost.resolver.eureka")

#: how long an empty list from a full fetch is held (a server restarted empty: Spring's instances renew every
#: 30 s, and register again at the first renewal it answers 404)
SETTLE = 35.0


class EurekaResolver(LoopResolver[EurekaClient]):
    """Follows the UP instances of ``target``'s app (scheme eureka); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial) and each server's try of a fetch; ``settle``: how long an
    empty list from a full fetch is held. ``rng`` and ``clock`` are for tests.
    """

    kind = "eureka"
    noun = "instances"
    list_name = "list of the instances"
    log = log

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 settle: float = SETTLE, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        require_client()
        if target.scheme != "eureka" or not target.key:
            raise InvalidTarget(f"not a eureka target: {target.redacted}")
        super().__init__(target, options, rng=rng, clock=clock)
        settings = from_target(target, target.key)
        self.config = settings.config
        self.app = settings.app
        self.interval = settings.interval
        self.timeout = timeout
        self.settle = settle
        self.copy = RegistryCopy()
        self._full_next = True  # the next fetch is a full one
        self._full_reason = "first fetch"
        #: an empty list from a full fetch, held (module docstring, 5)
        self._empty = EmptyListHold(settle, clock, on_start=self._hold_started, on_expired=self._hold_expired)
        self._warned: set[str] = set()
        #: the last failure when no server could be connected to ("": another failure, or none)
        self._unreachable = ""
        # introspection (and tests)
        self.full_fetches = 0
        self.delta_fetches = 0
        self.mismatches = 0
        self.failures = 0
        self.malformed = 0

    def __repr__(self) -> str:
        return f"<EurekaResolver {self.target.redacted} full={self.full_fetches} delta={self.delta_fetches}>"

    # ---- the loop -----------------------------------------------------------------------------------

    def _what(self) -> str:
        return f"app {self.app} at {self.config.url}"

    def _first_list_within(self) -> float:
        return self.timeout

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[EurekaClient]:
        # until the first list, every server's try fits in the start's timeout (its error then names each)
        per_server = self.timeout if self._first.done() else 0.8 * self.timeout / len(self.config.servers)
        client = EurekaClient(self.config, timeout=per_server)
        try:
            yield client
        finally:
            await client.close()

    async def _follow(self, session: EurekaClient) -> None:
        """One fetch (after the interval, unless the last one failed: the loop's backoff paused then)."""
        client = session
        if self._failing == 0 and (self.full_fetches or self.delta_fetches):
            await asyncio.sleep(cool_down(self._rng, self.interval))
        if self._first.done():
            client.timeout = self.timeout
        problems: list[str] = []
        from_full = self._full_next or not self.copy.filled
        if from_full:
            await self._fetch_all(client, problems)
        else:
            body = await client.delta()
            apps = applications(body, client.server)
            self.delta_fetches += 1
            self.copy.apply_delta(apps, problems)
            expected = str(apps.get("apps__hashcode", ""))
            if expected != self.copy.hashcode():
                self.mismatches += 1
                log.debug("waypost: eureka: %s: hash code %r after the delta, the server's is %r: fetching everything",
                          self._what(), self.copy.hashcode(), expected)
                self._full_reason = "hash code mismatch"
                await self._fetch_all(client, problems)
                from_full = True
        self._warn(problems)
        self._unreachable = ""
        if self._read_worked():
            log.info("waypost: eureka: reading %s works again", self._what())
        backends = self.backends()
        if not self._hold(backends, from_full):
            self._push(backends)

    async def _fetch_all(self, client: EurekaClient, problems: list[str]) -> None:
        body = await client.apps()
        apps = applications(body, client.server)
        self.copy.replace(apps, problems)
        self.full_fetches += 1
        self._full_next = False

    def _failed(self, e: Exception) -> None:
        self.failures += 1
        self._unreachable = str(e) if isinstance(e, EurekaUnreachable) else ""
        self._full_next = True  # after a failure: everything again (a server may have restarted, or failed over)
        self._full_reason = "after a failure"
        self._report(self._describe(e), e)

    def _warn(self, problems: list[str]) -> None:
        if not problems:
            return
        self.malformed += len(problems)
        for problem in dict.fromkeys(problems):
            if problem not in self._warned:
                if len(self._warned) >= 64:
                    self._warned.clear()
                self._warned.add(problem)
                log.warning("waypost: eureka: skipping a malformed instance in the answer for %s: %s", self._what(),
                            problem)

    def _hold(self, backends: tuple[Backend, ...], from_full: bool) -> bool:
        """Whether to keep the last list instead of this empty one from a full fetch (module docstring, 5)."""
        return self._empty.hold(not backends and bool(self._last), may_start=from_full)

    @property
    def holds(self) -> int:
        """Empty lists from a full fetch held."""
        return self._empty.holds

    def _hold_started(self) -> None:
        log.info("waypost: eureka: %s has no UP instance after a full fetch (%s); keeping the last %d for up to "
                 "%gs unless they come back", self._what(), self._full_reason, len(self._last or ()), self.settle)

    def _hold_expired(self, held: float) -> None:
        log.warning("waypost: eureka: %s has had no UP instance for %gs: applying the empty list", self._what(), held)

    def _describe(self, e: Exception) -> str:
        if isinstance(e, EurekaUnreachable):  # it says where, once: no need to name the target's servers again
            return f"{e} (reading app {self.app})"
        return f"eureka: reading {self._what()} failed: {failure_text(e)}"

    def _no_list_error(self) -> str:
        if self._unreachable:  # one sentence: cannot reach Eureka at URL: connection refused; is it running?
            return (f"{self._unreachable} (no {self.list_name} of app {self.app} within "
                    f"{self._first_list_within():g}s)")
        return super()._no_list_error()

    def backends(self) -> tuple[Backend, ...]:
        """The app's UP instances as backends (sorted by address; one per address: the first by instance id)."""
        by_address: dict[str, Backend] = {}
        for inst in self.copy.instances(self.app):
            if inst.status != "UP":
                continue
            address = inst.address
            if address is None:
                log.debug("waypost: eureka: skipping instance %r of %s without a usable address", inst.id,
                          self._what())
                continue
            by_address.setdefault(address, Backend(address, dict(inst.metadata)))
        return tuple(by_address[a] for a in sorted(by_address))

