"""The DNS kind: ``dns:///host:port`` targets (A/AAAA records, re-resolved periodically); read only. docs/dns.md."""

from __future__ import annotations

from ...kinds import RegistryKind, Words
from .target import GRPC_DEFAULT_PORT

_HERE = "waypost.registries.dns."

# dnspython only for a DNS server named in the target
KIND = RegistryKind(
    "dns", GRPC_DEFAULT_PORT, "dns:///greet.example.com:8080", extra="dns",
    discovery=_HERE + "discovery:DnsDiscovery", parse_target=_HERE + "target:parse_dns_target", title="DNS",
    words=Words(instance="address", instances="addresses", list_name="address list", read_failed="{error}"),
)
