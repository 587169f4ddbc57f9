"""The grammar of DNS dial targets: ``dns:///host[:port]``, ``dns://DNS_IP[:DNS_PORT]/host[:port]`` and gRPC's
opaque ``dns:host[:port]`` (port default 443, as gRPC; DNS port default 53). The name goes in ``endpoints`` (one
``host:port``), the DNS server, if any, in ``authority``."""

from __future__ import annotations

import ipaddress

from ...netutil import AddressError, join_host_port, parse_host_port
from ...resolver.target import Target, fail

#: gRPC's port of a name given without one
GRPC_DEFAULT_PORT = 443
DNS_SERVER_DEFAULT_PORT = 53


def parse_dns_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """A ``Target`` of scheme dns (the kind's ``parse_target``); ``InvalidTarget`` names what is wrong."""

    def hostport(text: str, default_port: int, what: str) -> tuple[str, int]:
        try:
            return parse_host_port(text, what=what, default_port=default_port)
        except AddressError as e:
            fail(scheme, raw, str(e))

    server = ""
    if authority:
        host, port = hostport(authority, DNS_SERVER_DEFAULT_PORT, "DNS server")
        server = join_host_port(host, port)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            fail(scheme, raw, f"the DNS server {server!r} must be an IP address")
    name = path[1:]
    if not name:
        fail(scheme, raw, "missing the name to resolve")
    if "," in name:
        fail(scheme, raw, "a dns target names exactly one host:port")
    endpoint = join_host_port(*hostport(name, GRPC_DEFAULT_PORT, "name"))
    return Target(scheme="dns", endpoints=(endpoint,), raw=raw, authority=server)
