"""The Consul kind: ``consul://HOST:8500`` registries (service instances in Consul's catalog, with a TTL check)
and ``consul://HOST:8500/SERVICE`` targets (its passing instances). docs/consul.md."""

from __future__ import annotations

from ...kinds import RegistryKind, Words
from .config import CONSUL_DEFAULT_PORT, CONSUL_EXAMPLE

_HERE = "waypost.registries.consul."

KIND = RegistryKind(
    "consul", CONSUL_DEFAULT_PORT, "consul://127.0.0.1:8500/greet", CONSUL_EXAMPLE,
    parse_url=_HERE + "config:parse_registry_url", registrar=_HERE + "registrar:ConsulRegistrar",
    discovery=_HERE + "discovery:ConsulDiscovery", console_source=_HERE + "console:ConsulSource",
    override_store=_HERE + "overrides:ConsulOverrideStore",
    target_params=("tag", "dc", "token", "tls", "cacert", "certfile", "keyfile"), max_hosts=1,
    extra="consul", title="Consul",
    words=Words(list_name="list of the instances", renewal="a pass of its TTL check",
                lost="no {renewal} worked for {overdue:.1f}s (TTL {ttl}s), so the check is critical: {error}",
                read_failed="consul: reading the instances of {what} failed: {error}",
                left_behind="could not deregister {id!r} (it leaves the passing list within {ttl}s and the catalog "
                            "a minute or so later)"),
)
