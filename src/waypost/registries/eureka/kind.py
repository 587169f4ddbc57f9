"""The Eureka kind (Spring Cloud Netflix): ``eureka://H1:8761,H2:8761`` registries (instances of an application,
renewed by heartbeats) and ``eureka://H:8761/APP`` targets (its UP instances). docs/eureka.md."""

from __future__ import annotations

import functools

from ...kinds import RegistryKind, Target, Words
from ...resolver.target import fail, parse_service_target
from .config import DEFAULT_PORT, EXAMPLE, TARGET_EXAMPLE, TARGET_OPTIONS, check_path, parse_interval

_HERE = "waypost.registries.eureka."

KIND = RegistryKind(
    "eureka", DEFAULT_PORT, TARGET_EXAMPLE, EXAMPLE, parse_url=_HERE + "config:parse_registry_url",
    registrar=_HERE + "registrar:EurekaRegistrar", discovery=_HERE + "discovery:EurekaDiscovery",
    console_source=_HERE + "console:EurekaSource", override_store=_HERE + "overrides:EurekaOverrideStore",
    parse_target=_HERE + "kind:parse_eureka_target", target_params=TARGET_OPTIONS, extra="eureka", title="Eureka",
    words=Words(list_name="list of the instances", renewal="a heartbeat", id_format="{host}:{service}:{port}",
                lost="no {renewal} succeeded for {overdue:.1f}s (lease {ttl}s), so Eureka may have evicted the "
                     "instance: {error}",
                read_failed="{error}", left_behind="could not delete {id!r} (Eureka evicts it within {ttl}s)"),
)


def parse_eureka_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """The hosts-and-service grammar of every kind holding instances, ``interval=`` and ``path=`` checked."""
    bad = functools.partial(fail, scheme, raw)
    for name, value in params.items():
        if name == "interval":
            parse_interval(value, bad)
        elif name == "path":
            check_path(value, bad)
    return parse_service_target(KIND, authority, path, params, raw)
