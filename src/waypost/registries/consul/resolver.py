"""consul://HOST:PORT/SERVICE: the passing instances of a Consul service, followed with blocking queries.

On the control loop, one long poll at a time on the agent's health endpoint
(``/v1/health/service/SERVICE?passing=1[&tag=T...][&dc=DC]&index=N&wait=55s``):

1. the first query (index 0) answers at once: the list, and ``X-Consul-Index``;
2. each next query passes that index and waits until the result changes (or ``wait`` s pass, then it
   answers the same list and it is asked again); a change that leaves the backend list as it was
   (another check's output, an unrelated node) is not pushed;
3. Consul's advice for blocking clients: an index that goes backwards (a restarted agent or servers,
   a snapshot restore) resets to 0 (the next query answers at once, and resumes from the new index);
   the index is kept at >= 1 so a query always blocks; queries are at least ``MIN_SPACING`` s apart;
4. agent unreachable, or any other failure: the channel keeps the last list (``on_error`` says why, once
   per new reason) and the resolver retries with backoff (0.5 s doubling up to 10 s, jittered); the first
   query that works again is an immediate read (the current list and index: nothing missed; the list is
   pushed again even when unchanged, which tells the channel the resolver works again), compared with the last index as in 3, and blocking resumes from there. (A
   blocking query with the old index would, against an agent restarted with less state, wait its whole
   ``wait`` before the lower index showed.)
5. an answer that is not Consul's (not JSON, not a list, no well-formed entry: a proxy or another server at
   the agent's address) is a failure like 4 (kept list, backoff, ``on_error``), counted in
   ``waypost_resolver_errors_total{reason="malformed"}``; malformed entries beside well-formed ones are
   skipped (each distinct problem logged once) and the rest is used;
6. right after a reconnect (within ``settle`` s of the first good answer after a failure), an empty answer
   does not replace a list that had instances until it has stayed empty for ``settle`` s: an agent back from
   an outage longer than its TTL checks restores every instance as critical until their owners pass the
   checks again. A non-empty answer is applied at once; outside that window an empty one is too.

Until the first list, a read is bounded by less than what is left of a blocking start's ``timeout``, so the
start's error names what went wrong (refused, no answer on an accepted connection, a malformed answer).

Parameters: ``tag=a,b`` (every tag required: ``?tag=a&tag=b``), ``dc=NAME`` (another datacenter, through
the agent), ``token=`` (else ``$CONSUL_HTTP_TOKEN``), ``tls=1``, ``cacert``, ``certfile``, ``keyfile``.

With ACLs on, Consul silently leaves out the instances a token may not read (the answer is still 200); the
resolver logs a WARNING when Consul says so (``X-Consul-Results-Filtered-By-ACLs``) or when the list is empty
under a default-deny policy (a token without service:read on the service gets an empty, unflagged answer).

Backends: ``host:port`` with the service's ``Address`` (else the node's) and ``Port``; their metadata is
the service's ``Meta`` decoded (``waypost.registries.consul.api.decode_meta``: JSON text back to values, other strings
as they are) plus ``tags`` (a list) when the instance has tags. Two instances on one address: the first by
ID wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from ... import metrics
from ...errors import InvalidTarget, PermissionDenied, RegistryError, RegistryUnavailable
from ...resolver.base import ResolverOptions
from ...resolver.empty_hold import EmptyListHold
from ...resolver.loop_resolver import LoopResolver
from ...resolver.read_failure import failure_text
from ...resolver.target import Target
from ...types import Backend
from .api import ConsulClient, ConsulTLSError, require_client
from .config import TOKEN_ENV, from_target
from .health import MalformedAnswer, read_entries

log = logging.getLogger("waypost.resolver.consul")

#: a blocking query's wait (Consul's default is 5 min; a minute keeps dead links short-lived)
WAIT = 55.0
#: never two queries closer than this (Consul's "rate limit" advice for blocking clients)
MIN_SPACING = 0.05
#: after a reconnect, how long an empty answer must last before it empties a list that had instances
SETTLE = 10.0


class ConsulResolver(LoopResolver[ConsulClient]):
    """Follows the passing instances of ``target`` (scheme consul); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial) and every non-blocking request; ``wait`` is the blocking
    query's wait; ``settle``: how long an empty answer right after a reconnect is held (see ``_hold``).
    ``rng`` and ``clock`` are for tests.
    """

    kind = "consul"
    noun = "instances"
    list_name = "list of the instances"
    log = log

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 wait: float = WAIT, settle: float = SETTLE, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        require_client()
        if target.scheme != "consul" or not target.key:
            raise InvalidTarget(f"not a consul target: {target.redacted}")
        super().__init__(target, options, rng=rng, clock=clock)
        self.config = from_target(target)
        self.service: str = target.key
        tag = target.options.get("tag")
        self.tags: tuple[str, ...] = tuple(tag.split(",")) if tag else ()
        self.datacenter: str | None = target.options.get("dc") or None
        self.timeout = timeout
        self.wait = wait
        self.settle = settle
        self._started = clock()  # when the first list's deadline started (set again by the loop)
        self._last_query = 0.0
        self._reconnected_at: float | None = None  # clock time of the first good answer after a failure
        #: an empty answer right after a reconnect, held (see ``_hold``)
        self._empty = EmptyListHold(settle, clock, on_start=self._hold_started, on_expired=self._hold_expired)
        self._warned: set[str] = set()  # the malformed-entry problems already logged
        # introspection (and tests)
        self.queries = 0
        self.failures = 0
        self.resets = 0
        #: malformed entries skipped in answers otherwise used
        self.malformed = 0
        #: whether the last answer may have left out instances for lack of ACL permission (warned on each change)
        self.acl_hidden = False
        self.index = 0

    def __repr__(self) -> str:
        return f"<ConsulResolver {self.target.redacted} index={self.index}>"

    # ---- the loop -----------------------------------------------------------------------------------

    def _what(self) -> str:
        extra = "".join(f" tag={t}" for t in self.tags) + (f" dc={self.datacenter}" if self.datacenter else "")
        return f"service {self.service!r}{extra} at {self.config.redacted}"

    def _first_list_within(self) -> float:
        return self.timeout

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[ConsulClient]:
        client = ConsulClient(self.config, timeout=self.timeout)
        self._started = self._clock()
        try:
            yield client
        finally:
            await client.close()

    async def _follow(self, client: ConsulClient) -> None:
        """One query, its answer pushed. Everything from the request to the push is guarded by the loop:
        whatever the answer (or a bug of ours), it keeps the last list and tries again until close()."""
        spacing = self._last_query + MIN_SPACING - self._clock()
        if spacing > 0:
            await asyncio.sleep(spacing)
        self._last_query = self._clock()
        # after a failure, one immediate read (no wait): a Consul that went back in time (agent or servers
        # restarted with less state) would otherwise hold a query with our old, higher index until its wait
        # ends before the backwards index could be seen
        index, entries = await client.health_service(
            self.service, index=self.index, wait=None if self._failing else self._query_wait(),
            tags=self.tags, datacenter=self.datacenter, timeout=self._read_timeout(),
            within=self.timeout if not self._first.done() else None)  # a timeout names the start's bound
        self._answered(client, index, self.backends(entries))

    def _read_timeout(self) -> float | None:
        """The bound of a non-blocking read. Until the first list, shorter than what is left of a blocking
        start's ``timeout``: a read that hangs then fails (saying how) before the start gives up, and the
        start's error names it."""
        if self._first.done():
            return None
        left = self._started + self.timeout - self._clock()
        return max(0.8 * left, 0.1) if left > 0 else None

    def _query_wait(self) -> float:
        """A blocking query's wait: ``wait``, or, while an empty answer is held, what is left of the hold
        (the answer after it confirms the empty list, unless the list changed meanwhile)."""
        if self._empty.since is None:
            return self.wait
        return min(self.wait, max(self._empty.since + self.settle - self._clock(), 0.1))

    def _failed(self, e: Exception) -> None:
        self.failures += 1
        msg = self._describe(e)
        # refusals a retry will not cure: a blocking start reports them at once
        refused = isinstance(e, PermissionDenied | ConsulTLSError) or (
            isinstance(e, RegistryError) and "no path to datacenter" in str(e).lower())
        if refused:
            self._end_first_wait(RegistryUnavailable(msg))
        if isinstance(e, MalformedAnswer):
            reason = "malformed"
        elif refused:
            reason = "refused"
        elif isinstance(e, RegistryUnavailable):
            reason = "unavailable"
        else:
            reason = "error"
        obs = metrics.current
        if obs is not None:
            obs.resolver_error(self.target.raw or self.target.redacted, reason)
        self._report(msg, e)

    def _answered(self, client: ConsulClient, index: int, backends: tuple[Backend, ...]) -> None:
        """A good answer: follow its index, then push its list (or hold an empty one; see ``_hold``)."""
        self.queries += 1
        if self._read_worked():
            log.info("waypost: consul: reading %s works again", self._what())
            self._reconnected_at = self._clock()
        if index < self.index:
            # Consul's advice: an index that goes backwards resets the loop
            log.info("waypost: consul: the index of %s went back from %d to %d: starting over",
                     self._what(), self.index, index)
            self.resets += 1
            self.index = 0
        else:
            self.index = max(index, 1)
        # Consul answers 200 with the instances the token may not read left out (flagged), or nothing
        # at all when it may not read the service (not flagged: only the default policy tells)
        hidden = client.filtered_by_acls or (not backends and client.default_acl_policy == "deny")
        if hidden and not self.acl_hidden:
            log.warning("waypost: consul: %s %s; with ACLs on (default policy %s) the token (%s) needs "
                        "service:read on %r and node:read (give ?token= or set $%s)", self._what(),
                        "has instances this token may not read" if client.filtered_by_acls
                        else "has no instance this token can see", client.default_acl_policy or "?",
                        "none given" if not self.config.effective_token() else "the one given",
                        self.service, TOKEN_ENV)
        self.acl_hidden = hidden
        if not self._hold(backends):
            self._push(backends)

    def _hold(self, backends: tuple[Backend, ...]) -> bool:
        """Whether to keep the last list instead of this empty answer, just after a reconnect.

        An agent that comes back after being down longer than its TTL checks restores every instance as
        critical, and passes them only when their owners reach it again (a publisher's next pass, an HTTP
        check's next run): for that moment the passing list is empty although nothing is gone. So within
        ``settle`` s of a reconnect, an empty answer does not replace a non-empty list until it has stayed
        empty for ``settle`` s (a blocking query bounded by what is left confirms it); any non-empty answer
        is applied at once and ends the hold. Outside that window an empty answer is applied as it comes."""
        reconnected = self._reconnected_at is not None and self._clock() - self._reconnected_at < self.settle
        return self._empty.hold(not backends and bool(self._last), may_start=reconnected)

    @property
    def holds(self) -> int:
        """Empty answers held after a reconnect."""
        return self._empty.holds

    def _hold_started(self) -> None:
        log.info("waypost: consul: %s answered no passing instance right after a reconnect; keeping the last %d "
                 "for up to %gs unless they come back", self._what(), len(self._last or ()), self.settle)

    def _hold_expired(self, held: float) -> None:
        log.warning("waypost: consul: %s has had no passing instance for %gs since a reconnect: applying the "
                    "empty list", self._what(), held)

    def _describe(self, e: Exception) -> str:
        return f"consul: reading the instances of {self._what()} failed: {failure_text(e)}"

    def backends(self, entries: Sequence[Any]) -> tuple[Backend, ...]:
        """The backends of health entries (sorted by address; one per address: the first by service ID).

        Malformed entries are skipped (each distinct problem logged once); ``MalformedAnswer`` when there are
        entries and every one is malformed (the answer is not Consul's: the last list is kept)."""
        got = read_entries(entries)
        if got.malformed:
            problems = list(dict.fromkeys(got.malformed))
            if not got.instances:
                raise MalformedAnswer(f"malformed answer from consul at {self.config.base_url}: no entry of the "
                                      f"{len(got.malformed)} is an instance ({'; '.join(problems)[:300]})")
            self.malformed += len(got.malformed)
            obs = metrics.current
            if obs is not None:
                obs.resolver_error(self.target.raw or self.target.redacted, "malformed_entry")
            for problem in problems:
                if problem not in self._warned:
                    if len(self._warned) >= 64:
                        self._warned.clear()
                    self._warned.add(problem)
                    log.warning("waypost: consul: skipping malformed entries in the answer for %s: %s",
                                self._what(), problem)
        for sid in got.unusable:
            log.debug("waypost: consul: skipping instance %r of %s without a usable address", sid, self._what())
        by_address: dict[str, tuple[str, Backend]] = {}
        for inst in got.instances:
            if inst.address not in by_address or inst.id < by_address[inst.address][0]:
                by_address[inst.address] = (inst.id, Backend(inst.address, inst.metadata))
        return tuple(by_address[a][1] for a in sorted(by_address))
