"""The Eureka kind (Spring Cloud Netflix): ``eureka://H1:8761,H2:8761`` registries (instances of an application,
renewed by heartbeats) and ``eureka://H:8761/APP`` targets (its UP instances). docs/eureka.md."""

from __future__ import annotations

from ...registry.kinds import RegistryKind
from .config import DEFAULT_PORT, EXAMPLE, TARGET_EXAMPLE

_HERE = "waypost.registries.eureka."

KIND = RegistryKind(
    "eureka", DEFAULT_PORT, TARGET_EXAMPLE, EXAMPLE,
    parse_url=_HERE + "config:parse_registry_url", publisher=_HERE + "publisher:EurekaPublisher",
    resolver=_HERE + "resolver:EurekaResolver", console_source=_HERE + "console_source:EurekaSource",
    override_store=_HERE + "console_source:EurekaOverrideStore",
    parse_target=_HERE + "target:parse_eureka_target", target_params=("path", "interval", "tls"),
    extra="eureka", title="Eureka",
)
