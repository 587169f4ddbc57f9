"""The Eureka kind (Spring Cloud Netflix): ``eureka://H1:8761,H2:8761`` registries (instances of an application,
renewed by heartbeats) and ``eureka://H:8761/APP`` targets (its UP instances). docs/eureka.md."""

from __future__ import annotations

from ...kinds import RegistryKind, Words
from .config import DEFAULT_PORT, EXAMPLE, TARGET_EXAMPLE, TARGET_OPTIONS

_HERE = "waypost.registries.eureka."

KIND = RegistryKind(
    "eureka", DEFAULT_PORT, TARGET_EXAMPLE, EXAMPLE, parse_url=_HERE + "config:parse_registry_url",
    registrar=_HERE + "registrar:EurekaRegistrar", discovery=_HERE + "discovery:EurekaDiscovery",
    console_source=_HERE + "console:EurekaSource", override_store=_HERE + "overrides:EurekaOverrideStore",
    parse_target=_HERE + "target:parse_eureka_target", target_params=TARGET_OPTIONS,
    extra="eureka", title="Eureka",
    words=Words(list_name="list of the instances", renewal="a heartbeat", id_format="{host}:{service}:{port}",
                lost="no {renewal} succeeded for {overdue:.1f}s (lease {ttl}s), so Eureka may have evicted the "
                     "instance: {error}",
                read_failed="{error}", left_behind="could not delete {id!r} (Eureka evicts it within {ttl}s)"),
)
