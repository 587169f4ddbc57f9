"""The direct kind's row: ``direct:///a:1,b:2`` targets are the addresses given (their grammar is the dial
target parser's own: ``waypost.resolver.target``)."""

from __future__ import annotations

from ...kind_table import RegistryKind

KIND = RegistryKind("direct", None, "direct:///127.0.0.1:8080,127.0.0.1:8081",
                    discovery="waypost.registries.direct.discovery:DirectDiscovery")
