"""dns:///host:port and dns://DNS_IP:PORT/host:port: A/AAAA records, re-resolved periodically.

gRPC's DNS resolver re-resolves only after a connection fails, so backends added behind a name are
never used by a healthy client (grpc-go#3353). Here the name is re-resolved on the control loop:

- every ``interval`` seconds (default 30; channel option ``waypost.dns_refresh_interval_ms``), sooner
  when the records' TTL is shorter (known only with a DNS server in the target, via dnspython), but never
  sooner than ``min_interval`` (default 5 s; gRPC's ``grpc.dns_min_time_between_resolutions_ms``);
- right after a backend connection fails (``resolve_now``), at most once per ``min_interval``;
- after a failed lookup, with backoff (1 s doubling up to ``interval``), keeping the last good set.

A ``waypost.kinds.PollingDiscovery``: waypost's generic resolver follows it. A blocking start (sync dial) returns
once the first lookup has answered, with its list or its failure (a name that does not resolve is not a dial
error: calls fail naming it while lookups go on); a non-blocking one (aio dial) returns at once.

The system resolver (``getaddrinfo``) is used for ``dns:///``; a DNS server in the authority needs
dnspython (``pip install 'waypost[dns]'``). See docs/dns.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...kinds import Backend, Backoff, InvalidTarget, LookupFailed, PollingDiscovery, Target
from ...netutil import join_host_port, parse_host_port

log = logging.getLogger("waypost.resolver.dns")

DEFAULT_INTERVAL = 30.0
DEFAULT_MIN_INTERVAL = 5.0
#: Per lookup (A and AAAA are asked in parallel), with a DNS server in the target.
DEFAULT_TIMEOUT = 5.0
#: First retry delay after a failed lookup; doubles up to the interval.
FIRST_BACKOFF = 1.0

#: Channel options read by this resolver (milliseconds, like gRPC's own DNS options).
INTERVAL_OPTION = "waypost.dns_refresh_interval_ms"
MIN_INTERVAL_OPTION = "grpc.dns_min_time_between_resolutions_ms"
TIMEOUT_OPTION = "grpc.dns_ares_query_timeout"


class DnsLookupError(LookupFailed):
    """A lookup gave no usable address; the message names the host (and the server, if any)."""


@dataclass(frozen=True)
class Resolution:
    """One successful lookup: ``ip:port`` strings (sorted, deduplicated) and the smallest record TTL in
    seconds (None when unknown: the system resolver, or an IP literal)."""

    addresses: tuple[str, ...]
    ttl: float | None


def next_delay(ttl: float | None, interval: float, min_interval: float) -> float:
    """Seconds until the next periodic lookup: the TTL clamped to [min_interval, interval]; the interval
    when the TTL is unknown. A long TTL does not delay past the interval (the point is to see scale-ups)."""
    if ttl is None:
        return interval
    return min(interval, max(min_interval, ttl))


def _seconds_option(options: dict[str, Any], name: str, default: float) -> float:
    if name not in options:
        return default
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ValueError(f"channel option {name!r} expects a number of milliseconds > 0, got {value!r}")
    return value / 1000.0


class DnsDiscovery(PollingDiscovery):
    """Resolves ``target`` (scheme dns): a ``waypost.kinds.Discovery`` that waypost's generic resolver follows.

    ``interval``, ``min_interval`` and ``timeout`` are in seconds (None: the defaults); the dial's channel options
    override them (``configure``). Every lookup answers: a failed one is a ``DnsLookupError`` (a
    ``waypost.kinds.LookupFailed``), so a blocking start (sync dial) returns once the first lookup has answered,
    with the list or with its failure already passed to the channel (a name that does not resolve is not a dial
    error: calls fail naming it, and lookups go on).
    """

    def __init__(self, target: Target, *, interval: float | None = None, min_interval: float | None = None,
                 timeout: float | None = None) -> None:
        self.target = target
        self.interval = DEFAULT_INTERVAL if interval is None else interval
        self.min_interval = DEFAULT_MIN_INTERVAL if min_interval is None else min_interval
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self._check()
        self.host, self.port = parse_host_port(target.endpoints[0], what="dns name")
        self._server: tuple[str, int] | None = None
        if target.authority:
            try:
                import dns.asyncresolver  # noqa: F401
            except ImportError:
                raise InvalidTarget(
                    f"{target.redacted}: a DNS server in the target needs dnspython (pip install 'waypost[dns]'); "
                    f"or use the system resolver: dns:///{target.endpoints[0]}") from None
            self._server = parse_host_port(target.authority, what="DNS server")
        self._ttl: float | None = None
        #: Lookups done so far (introspection and tests).
        self.lookups = 0

    # ---- configuration ------------------------------------------------------------------------------

    def _check(self) -> None:
        for name in ("interval", "min_interval", "timeout"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"dns resolver: {name} must be a number of seconds > 0, got {value!r}")
        self.read_timeout = self.timeout
        self.backoff = Backoff(first=min(FIRST_BACKOFF, self.interval), cap=self.interval, jitter=0.0)

    def configure(self, channel_options: Mapping[str, Any]) -> None:
        """Take the intervals from channel options (milliseconds): ``waypost.dns_refresh_interval_ms``,
        ``grpc.dns_min_time_between_resolutions_ms``, ``grpc.dns_ares_query_timeout``."""
        opts = dict(channel_options)
        self.interval = _seconds_option(opts, INTERVAL_OPTION, self.interval)
        self.min_interval = _seconds_option(opts, MIN_INTERVAL_OPTION, self.min_interval)
        self.timeout = _seconds_option(opts, TIMEOUT_OPTION, self.timeout)
        self._check()

    def describe(self, service: str) -> str:
        return f"{self.host}{self._where()}"

    # ---- the reads ----------------------------------------------------------------------------------

    async def instances(self, service: str) -> tuple[Backend, ...]:
        """One lookup (``DnsLookupError`` when it gives no usable address)."""
        self.lookups += 1
        try:
            res = await self.lookup()
        except DnsLookupError:
            raise
        except Exception as e:  # whatever went wrong, a lookup answers (and names the host)
            raise DnsLookupError(f"dns: resolving {self.host} failed: {e!r}") from e
        log.debug("waypost: %s: ttl %s", self.target.redacted, res.ttl)
        self._ttl = res.ttl
        return tuple(Backend(a) for a in res.addresses)

    def next_interval(self) -> float:
        return next_delay(self._ttl, self.interval, self.min_interval)

    # ---- lookups ------------------------------------------------------------------------------------

    def _where(self) -> str:
        return f" via {join_host_port(*self._server)}" if self._server is not None else ""

    async def lookup(self) -> Resolution:
        """One lookup now. Raises ``DnsLookupError`` (naming the host) when there is no usable address."""
        try:
            ipaddress.ip_address(self.host)
            return Resolution((join_host_port(self.host, self.port),), None)
        except ValueError:
            pass
        if self._server is None:
            try:
                # bounded like a server lookup (the executor thread finishes on the system's own timeouts)
                infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
                    self.host, self.port, type=socket.SOCK_STREAM), self.read_timeout)
            except socket.gaierror as e:
                raise DnsLookupError(f"dns: cannot resolve {self.host}: {e.strerror or e}") from None
            except asyncio.TimeoutError:
                raise DnsLookupError(f"dns: resolving {self.host} (system resolver) timed out after "
                                     f"{self.read_timeout:g} s") from None
            ips = {str(info[4][0]) for info in infos}
            if not ips:
                raise DnsLookupError(f"dns: no addresses for {self.host}")
            return Resolution(tuple(sorted(join_host_port(ip, self.port) for ip in ips)), None)
        return await self._lookup_server()

    async def _lookup_server(self) -> Resolution:
        import dns.asyncresolver
        import dns.exception
        import dns.resolver

        assert self._server is not None
        r = dns.asyncresolver.Resolver(configure=False)
        r.nameservers = [self._server[0]]
        r.port = self._server[1]
        r.cache = None  # every lookup asks the server: the point is to see changes

        async def ask(rdtype: str) -> Any:
            try:
                return await r.resolve(self.host, rdtype, lifetime=self.read_timeout, search=False)
            except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN) as e:
                return e

        results = await asyncio.gather(ask("A"), ask("AAAA"), return_exceptions=True)
        ips: set[str] = set()
        ttls: list[float] = []
        nxdomain = 0
        for res in results:
            if isinstance(res, dns.resolver.NXDOMAIN):
                nxdomain += 1
            elif isinstance(res, dns.resolver.NoAnswer):
                pass
            elif isinstance(res, dns.exception.Timeout):
                raise DnsLookupError(f"dns: lookup of {self.host}{self._where()} timed out "
                                     f"after {self.read_timeout:g} s") from None
            elif isinstance(res, BaseException):
                raise DnsLookupError(f"dns: lookup of {self.host}{self._where()} failed: {res}") from None
            else:
                ips.update(a.to_text() for a in res)
                if res.rrset is not None:
                    ttls.append(float(res.rrset.ttl))
        if not ips:
            if nxdomain:
                raise DnsLookupError(f"dns: {self.host} does not exist (NXDOMAIN{self._where()})")
            raise DnsLookupError(f"dns: {self.host} has no A or AAAA records{self._where()}")
        return Resolution(tuple(sorted(join_host_port(ip, self.port) for ip in ips)), min(ttls) if ttls else None)

    async def resolve(self) -> list[str]:
        """The current addresses (``ip:port``), sorted, deduplicated."""
        return list((await self.lookup()).addresses)
