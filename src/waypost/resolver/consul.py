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
   query that works again is an immediate read (the current list and index: nothing missed, an unchanged
   list is not pushed again), compared with the last index as in 3, and blocking resumes from there. (A
   blocking query with the old index would, against an agent restarted with less state, wait its whole
   ``wait`` before the lower index showed.)

Parameters: ``tag=a,b`` (every tag required: ``?tag=a&tag=b``), ``dc=NAME`` (another datacenter, through
the agent), ``token=`` (else ``$CONSUL_HTTP_TOKEN``), ``tls=1``, ``cacert``, ``certfile``, ``keyfile``.

With ACLs on, Consul silently leaves out the instances a token may not read (the answer is still 200); the
resolver logs a WARNING when Consul says so (``X-Consul-Results-Filtered-By-ACLs``) or when the list is empty
under a default-deny policy (a token without service:read on the service gets an empty, unflagged answer).

Backends: ``host:port`` with the service's ``Address`` (else the node's) and ``Port``; their metadata is
the service's ``Meta`` decoded (``waypost.consul.api.decode_meta``: JSON text back to values, other strings
as they are) plus ``tags`` (a list) when the instance has tags. Two instances on one address: the first by
ID wins.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _loop
from ..consul.api import ConsulClient, ConsulTLSError, decode_meta, require_client
from ..consul.config import TOKEN_ENV, from_target
from ..errors import InvalidTarget, PermissionDenied, RegistryError, RegistryUnavailable
from ..netutil import join_host_port
from ..types import Backend
from .base import OnError, OnUpdate, ResolverOptions, notify
from .target import Target

log = logging.getLogger("waypost.resolver.consul")

#: a blocking query's wait (Consul's default is 5 min; a minute keeps dead links short-lived)
WAIT = 55.0
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0
#: never two queries closer than this (Consul's "rate limit" advice for blocking clients)
MIN_SPACING = 0.05


class ConsulResolver:
    """Follows the passing instances of ``target`` (scheme consul); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial) and every non-blocking request; ``wait`` is the blocking
    query's wait. ``rng`` and ``clock`` are for tests.
    """

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 wait: float = WAIT, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        require_client()
        options = options if options is not None else ResolverOptions()
        if target.scheme != "consul" or not target.key:
            raise InvalidTarget(f"not a consul target: {target.redacted}")
        self.target = target
        self.config = from_target(target)
        self.service: str = target.key
        tag = target.options.get("tag")
        self.tags: tuple[str, ...] = tuple(tag.split(",")) if tag else ()
        self.datacenter: str | None = target.options.get("dc") or None
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.report_early = options.report_early
        self.timeout = timeout
        self.wait = wait
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._future: concurrent.futures.Future[None] | None = None
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._closed = False
        self._last: tuple[Backend, ...] | None = None
        self._last_error = ""
        # introspection (and tests)
        self.queries = 0
        self.failures = 0
        self.resets = 0
        self.pushes = 0
        #: whether the last answer may have left out instances for lack of ACL permission (warned on each change)
        self.acl_hidden = False
        self.index = 0
        #: clock time of the last change pushed to the channel
        self.last_push_at: float | None = None

    def __repr__(self) -> str:
        return f"<ConsulResolver {self.target.redacted} index={self.index}>"

    # ---- Resolver contract --------------------------------------------------------------------------

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        """Follow the service on the control loop. Blocking (sync dial): return once the first list is known;
        raise RegistryUnavailable when the agent does not answer within ``timeout`` or refuses."""
        self._future = _loop.submit(self._run(on_update, on_error))
        if not self.blocking:
            return
        try:
            self._first.result(self.timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RegistryUnavailable(
                f"consul: no list of the instances of {self._what()} within {self.timeout:g}s"
                f"{f' ({self._last_error})' if self._last_error else ''}") from None
        except BaseException:
            self.close()
            raise

    def resolve_now(self, reason: str) -> None:
        """Nothing to do: the blocking query answers every change."""

    def close(self) -> None:
        self._closed = True
        if self._future is not None:
            self._future.cancel()

    async def aclose(self) -> None:
        self.close()

    # ---- the loop -----------------------------------------------------------------------------------

    def _what(self) -> str:
        extra = "".join(f" tag={t}" for t in self.tags) + (f" dc={self.datacenter}" if self.datacenter else "")
        return f"service {self.service!r}{extra} at {self.config.redacted}"

    async def _run(self, on_update: OnUpdate, on_error: OnError) -> None:
        client = ConsulClient(self.config, timeout=self.timeout)
        started = self._clock()
        failures = 0
        last_query = 0.0
        try:
            while not self._closed:
                spacing = last_query + MIN_SPACING - self._clock()
                if spacing > 0:
                    await asyncio.sleep(spacing)
                last_query = self._clock()
                try:
                    # after a failure, one immediate read (no wait): a Consul that went back in time (agent or
                    # servers restarted with less state) would otherwise hold a query with our old, higher
                    # index until its wait ends before the backwards index could be seen
                    index, entries = await client.health_service(
                        self.service, index=self.index, wait=None if failures else self.wait,
                        tags=self.tags, datacenter=self.datacenter)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001  # keep the last list, retry with backoff
                    failures += 1
                    self.failures += 1
                    msg = self._describe(e)
                    # refusals a retry will not cure: a blocking start reports them at once
                    refused = isinstance(e, PermissionDenied | ConsulTLSError) or (
                        isinstance(e, RegistryError) and "no path to datacenter" in str(e).lower())
                    if refused and not self._first.done():
                        self._first.set_exception(RegistryUnavailable(msg))
                    (log.warning if msg != self._last_error else log.debug)(
                        "waypost: %s; %s", msg,
                        "keeping the last instances" if self._last is not None else "no instances yet")
                    self._last_error = msg
                    if self.report_early or self._first.done() or self._clock() - started >= self.timeout:
                        self._notify(on_error, msg)
                    delay = min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF)
                    await asyncio.sleep(delay * self._rng.uniform(0.8, 1.2))
                    continue
                self.queries += 1
                if failures:
                    log.info("waypost: consul: reading %s works again", self._what())
                    failures, self._last_error = 0, ""
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
                hidden = client.filtered_by_acls or (not entries and client.default_acl_policy == "deny")
                if hidden and not self.acl_hidden:
                    log.warning("waypost: consul: %s %s; with ACLs on (default policy %s) the token (%s) needs "
                                "service:read on %r and node:read (give ?token= or set $%s)", self._what(),
                                "has instances this token may not read" if client.filtered_by_acls
                                else "has no instance this token can see", client.default_acl_policy or "?",
                                "none given" if not self.config.effective_token() else "the one given",
                                self.service, TOKEN_ENV)
                self.acl_hidden = hidden
                self._push(on_update, entries)
                if not self._first.done():
                    self._first.set_result(None)
        finally:
            await client.close()

    def _describe(self, e: Exception) -> str:
        text = str(e) or type(e).__name__
        return f"consul: reading the instances of {self._what()} failed: {text}"

    def backends(self, entries: Sequence[Mapping[str, Any]]) -> tuple[Backend, ...]:
        """The backends of health entries (sorted by address; one per address: the first by service ID)."""
        by_address: dict[str, tuple[str, Backend]] = {}
        for entry in entries:
            svc = entry.get("Service") or {}
            node = entry.get("Node") or {}
            host = svc.get("Address") or node.get("Address") or ""
            port = svc.get("Port")
            if not host or not isinstance(port, int) or not 0 < port < 65536:
                log.debug("waypost: consul: skipping instance %r of %s without a usable address",
                          svc.get("ID"), self._what())
                continue
            address = join_host_port(host.strip("[]"), port)
            sid = str(svc.get("ID") or "")
            backend = Backend(address, decode_meta(svc.get("Meta"), svc.get("Tags")))
            if address not in by_address or sid < by_address[address][0]:
                by_address[address] = (sid, backend)
        return tuple(by_address[a][1] for a in sorted(by_address))

    def _push(self, on_update: OnUpdate, entries: Sequence[Mapping[str, Any]]) -> None:
        backends = self.backends(entries)
        if backends == self._last:
            return
        out: Sequence[Backend] = list(backends)
        if self.subsetter is not None:
            out = self.subsetter.select(out)
        log.debug("waypost: consul: %s -> %s", self._what(), [b.address for b in backends])
        if self._notify(on_update, out):
            self._last = backends
            self.pushes += 1
            self.last_push_at = self._clock()

    def _notify(self, fn: Callable[[Any], None], arg: Any) -> bool:
        return notify(fn, arg, self.target)
