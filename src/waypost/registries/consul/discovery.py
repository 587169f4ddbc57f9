"""consul://HOST:PORT/SERVICE: the passing instances of a Consul service, followed with blocking queries of
``/v1/health/service/SERVICE?passing=1[&tag=..][&dc=..]&index=N&wait=55s``, as Consul advises blocking clients to
(an index that went back starts over; after a failure a plain read first), keeping the last list through failures,
malformed answers and, right after a reconnect, an empty answer until it lasts (docs/consul.md, "Targets").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ... import metrics
from ...kinds import Backend, Discovery, PermissionDenied, RegistryError, RegistryUnavailable, Target
from ...netutil import join_host_port
from ..http_kind import MalformedAnswer, ProblemsSaid, logged_hold
from .api import ConsulClient, ConsulTLSError, decode_meta, result_index
from .config import TOKEN_ENV, from_target

log = logging.getLogger("waypost.resolver.consul")

#: a blocking query's wait (Consul's default is 5 min; a minute keeps dead links short-lived)
WAIT = 55.0
#: never two queries closer than this (Consul's advice for blocking clients)
MIN_SPACING = 0.05
#: after a reconnect, how long an empty answer must last before it empties a list that had instances
SETTLE = 10.0
#: the bound of a non-blocking read, seconds
READ_TIMEOUT = 5.0


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def entry_problem(entry: Any) -> str | None:
    """What is wrong with the shape of one health entry (the same text for the same problem), or None."""
    if not isinstance(entry, Mapping):
        return f"an entry is a {_kind(entry)}, not an object"
    svc, node = entry.get("Service"), entry.get("Node")
    if not isinstance(svc, Mapping):
        return f"an entry's 'Service' is a {_kind(svc)}, not an object"
    if node is not None and not isinstance(node, Mapping):
        return f"an entry's 'Node' is a {_kind(node)}, not an object"
    for name, value, kinds in (("Service.ID", svc.get("ID"), str), ("Service.Address", svc.get("Address"), str),
                               ("Node.Address", (node or {}).get("Address"), str),
                               ("Service.Meta", svc.get("Meta"), Mapping), ("Service.Tags", svc.get("Tags"), list)):
        if value is not None and not isinstance(value, kinds):
            return f"an entry's '{name}' is a {_kind(value)}"
    port = svc.get("Port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
        return f"an entry's 'Service.Port' is a {_kind(port)}, not a number"
    return None


class ConsulDiscovery(Discovery):
    """The passing instances of a ``consul://`` target's service; see the module docstring."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.config = from_target(target)  # not a consul target: InvalidTarget
        tag = target.options.get("tag")
        self.tags: tuple[str, ...] = tuple(tag.split(",")) if tag else ()
        self.client = ConsulClient(self.config, timeout=READ_TIMEOUT)
        #: the hold of an empty answer right after a reconnect (``settle`` s; ``holds``: how many so far)
        self.empty = logged_hold(SETTLE, log, lambda: f"consul: {self.describe(self.service)} answered no passing "
                                 "instance right after a reconnect", lambda: len(self._last))
        self._last: tuple[Backend, ...] = ()
        self._failing = False
        self._last_query = 0.0
        self._started: float | None = None  # when the first read started (the dial's bound runs from there)
        self._reconnected_at: float | None = None
        self._said = ProblemsSaid()  # the malformed-entry problems already logged
        self.service = target.key or ""  # KindResolver refuses a target naming none
        # introspection (and tests): the index followed, answers, failed reads, index resets, malformed entries
        # skipped in answers otherwise used
        self.index = self.queries = self.failures = self.resets = self.malformed = 0
        #: whether the last answer may have left out instances for lack of ACL permission (warned on each change)
        self.acl_hidden = False

    def __repr__(self) -> str:
        return f"<ConsulDiscovery {self.target.redacted} index={self.index}>"

    def describe(self, service: str) -> str:
        dc = self.config.datacenter
        extra = "".join(f" tag={t}" for t in self.tags) + (f" dc={dc}" if dc else "")
        return f"service {service!r}{extra} at {self.config.redacted}"

    async def close(self) -> None:
        await self.client.close()

    async def instances(self, service: str) -> Sequence[Backend]:
        _, entries = await self.client.health_service(service, tags=self.tags)
        return self.backends(entries)

    async def watch(self, service: str) -> AsyncIterator[Sequence[Backend]]:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._last_query + MIN_SPACING - loop.time()))
            self._last_query = loop.time()
            timeout, within = self._first_read(loop.time())
            try:
                headers, entries = await self.client.health_service(
                    service, index=self.index, wait=None if self._failing else self._query_wait(),
                    tags=self.tags, timeout=timeout, within=within)
                backends = self.backends(entries)
            except Exception as e:  # noqa: BLE001 (counted, then raised on to the resolver)
                raise self._failed(e) from None
            if self._answered(service, headers, backends):
                self._last = backends
                yield backends

    def _first_read(self, now: float) -> tuple[float | None, float | None]:
        """Until the first list, a read's bound (shorter than what is left of the dial's: a read that hangs fails,
        saying how, before the dial gives up) and the bound its timeout names (the dial's); then None, None."""
        if self.queries or not self.dial_timeout:
            return None, None
        self._started = now if self._started is None else self._started
        left = self._started + self.dial_timeout - now
        return (max(0.8 * left, 0.1) if left > 0 else None), self.dial_timeout

    def _query_wait(self) -> float:
        """``WAIT``, or, while an empty answer is held, what is left of the hold (the answer after it confirms
        the empty list, unless the list changed meanwhile)."""
        if self.empty.since is None:
            return WAIT
        return min(WAIT, max(self.empty.since + self.empty.settle - time.monotonic(), 0.1))

    def _failed(self, e: Exception) -> Exception:
        """Count a failed read; a refusal a retry will not cure becomes ``PermissionDenied`` (a dial fails)."""
        self.failures += 1
        self._failing = True
        refused = isinstance(e, PermissionDenied | ConsulTLSError) or (
            isinstance(e, RegistryError) and "no path to datacenter" in str(e).lower())
        reason = ("malformed" if isinstance(e, MalformedAnswer) else "refused" if refused
                  else "unavailable" if isinstance(e, RegistryUnavailable) else "error")
        self._count(reason)
        return PermissionDenied(str(e)) if refused and not isinstance(e, PermissionDenied) else e

    def _count(self, reason: str) -> None:
        """``waypost_resolver_errors_total{reason=...}`` when metrics are on."""
        if metrics.current is not None:
            metrics.current.resolver_error(self.target.raw or self.target.redacted, reason)

    def _answered(self, service: str, headers: Mapping[str, str], backends: tuple[Backend, ...]) -> bool:
        """A good answer: follow its index; whether to push its list (not an empty one held after a reconnect)."""
        self.queries += 1
        index = result_index(headers)
        now = time.monotonic()
        if self._failing:
            self._failing, self._reconnected_at = False, now
        if index < self.index:
            log.info("waypost: consul: the index of %s went back from %d to %d: starting over",
                     self.describe(service), self.index, index)
            self.resets += 1
            self.index = 0
        else:
            self.index = max(index, 1)
        # a token that may not read some instances gets them left out (flagged), or all of them (not flagged:
        # only the default policy tells)
        filtered = headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true"
        policy = headers.get("X-Consul-Default-Acl-Policy", "")
        hidden = filtered or (not backends and policy == "deny")
        if hidden and not self.acl_hidden:
            log.warning("waypost: consul: %s %s; with ACLs on (default policy %s) the token (%s) needs "
                        "service:read on %r and node:read (give ?token= or set $%s)", self.describe(service),
                        "has instances this token may not read" if filtered
                        else "has no instance this token can see", policy or "?",
                        "none given" if not self.config.effective_token() else "the one given", service, TOKEN_ENV)
        self.acl_hidden = hidden
        reconnected = self._reconnected_at is not None and now - self._reconnected_at < self.empty.settle
        return not self.empty.hold(not backends and bool(self._last), may_start=reconnected)

    def backends(self, entries: Sequence[Any]) -> tuple[Backend, ...]:
        """The backends of health entries (sorted by address; one per address: the first by service ID).
        ``MalformedAnswer`` when there are entries and every one is malformed (the answer is not Consul's)."""
        problems: list[str] = []
        by_address: dict[str, tuple[str, Backend]] = {}
        for entry in entries:
            if (problem := entry_problem(entry)) is not None:
                problems.append(problem)
                continue
            svc, node = entry["Service"], entry.get("Node") or {}
            host, port, sid = svc.get("Address") or node.get("Address") or "", svc.get("Port"), svc.get("ID") or ""
            if not host or not isinstance(port, int) or not 0 < port < 65536:
                log.debug("waypost: consul: skipping instance %r of %s without a usable address", sid, self.service)
                continue
            address = join_host_port(host.strip("[]"), port)
            if address not in by_address or sid < by_address[address][0]:
                by_address[address] = (sid, Backend(address, decode_meta(svc.get("Meta"), svc.get("Tags"))))
        if problems:
            distinct = list(dict.fromkeys(problems))
            if len(problems) == len(entries):
                raise MalformedAnswer(f"malformed answer from consul at {self.config.base_url}: no entry of the "
                                      f"{len(problems)} is an instance ({'; '.join(distinct)[:300]})")
            self.malformed += len(problems)
            self._count("malformed_entry")
            for problem in self._said.new(distinct):
                log.warning("waypost: consul: skipping malformed entries in the answer for %s: %s",
                            self.describe(self.service), problem)
        return tuple(by_address[a][1] for a in sorted(by_address))
