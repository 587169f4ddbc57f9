"""dns:///host:port and dns://DNS_IP:PORT/host:port: A/AAAA records, re-resolved periodically.

gRPC's DNS resolver re-resolves only after a connection fails, so backends added behind a name are
never used by a healthy client (grpc-go#3353). Here the name is re-resolved every ``interval`` seconds
(default 30 s) on the control loop, and after every failure with backoff. The system resolver
(``getaddrinfo``) is used for ``dns:///``; a DNS server in the authority needs dnspython
(``pip install waypost[dns]``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from .. import _loop
from ..balancer.base import Backend
from ..errors import InvalidTarget
from .subset import Subsetter
from .target import Target

log = logging.getLogger("waypost.resolver.dns")

DEFAULT_INTERVAL = 30.0


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class DnsResolver:
    def __init__(self, target: Target, subsetter: Subsetter | None, *, interval: float | None = None) -> None:
        self.target = target
        self.subsetter = subsetter
        self.interval = DEFAULT_INTERVAL if interval is None else interval
        self.host, self.port = _split(target.endpoints[0])
        self._server: tuple[str, int] | None = None
        if target.authority:
            try:
                import dns.asyncresolver  # noqa: F401
            except ImportError:
                raise InvalidTarget(
                    f"{target.redacted}: a DNS server in the target needs dnspython (pip install 'waypost[dns]'); "
                    f"or use the system resolver: dns:///{target.endpoints[0]}") from None
            self._server = _split(target.authority)
        self._future: Any = None
        self._closed = False

    def start(self, on_update: Callable[[Sequence[Backend]], None], on_error: Callable[[str], None]) -> None:
        self._future = _loop.submit(self._run(on_update, on_error))

    async def resolve(self) -> list[str]:
        """The current addresses (``ip:port``), sorted, deduplicated."""
        try:
            ipaddress.ip_address(self.host)
            return [_join(self.host, self.port)]
        except ValueError:
            pass
        if self._server is None:
            infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            ips = {str(info[4][0]) for info in infos}
        else:
            import dns.asyncresolver
            import dns.resolver

            r = dns.asyncresolver.Resolver(configure=False)
            r.nameservers = [self._server[0]]
            r.port = self._server[1]
            ips = set()
            for rdtype in ("A", "AAAA"):
                try:
                    ans = await r.resolve(self.host, rdtype, lifetime=5.0)
                except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
                    continue
                ips.update(a.to_text() for a in ans)
            if not ips:
                raise OSError(f"no A/AAAA records for {self.host}")
        return sorted(_join(ip, self.port) for ip in ips)

    async def _run(self, on_update: Callable[[Sequence[Backend]], None], on_error: Callable[[str], None]) -> None:
        last: list[str] | None = None
        backoff = 1.0
        while not self._closed:
            try:
                addrs = await self.resolve()
            except Exception as e:  # noqa: BLE001  # keep the last list; retry with backoff
                log.warning("waypost: resolving %s failed: %s", self.target.redacted, e)
                on_error(f"dns: {e}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.interval)
                continue
            backoff = 1.0
            if addrs != last:
                last = addrs
                backends: Sequence[Backend] = [Backend(a) for a in addrs]
                if self.subsetter is not None:
                    backends = self.subsetter.select(backends)
                log.debug("waypost: %s -> %s", self.target.redacted, addrs)
                on_update(backends)
            await asyncio.sleep(self.interval)

    def close(self) -> None:
        self._closed = True
        if self._future is not None:
            self._future.cancel()
