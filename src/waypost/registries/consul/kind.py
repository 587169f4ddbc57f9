"""The Consul kind: ``consul://HOST:8500`` registries (service instances in Consul's catalog, with a TTL check)
and ``consul://HOST:8500/SERVICE`` targets (its passing instances). docs/consul.md."""

from __future__ import annotations

from ...registry.kinds import RegistryKind
from .config import CONSUL_DEFAULT_PORT, CONSUL_EXAMPLE

_HERE = "waypost.registries.consul."

KIND = RegistryKind(
    "consul", CONSUL_DEFAULT_PORT, "consul://127.0.0.1:8500/greet", CONSUL_EXAMPLE,
    parse_url=_HERE + "config:parse_registry_url", publisher=_HERE + "publisher:ConsulPublisher",
    resolver=_HERE + "resolver:ConsulResolver", console_source=_HERE + "console:ConsulSource",
    override_store=_HERE + "console:ConsulOverrideStore",
    target_params=("tag", "dc", "token", "tls", "cacert", "certfile", "keyfile"), max_hosts=1,
    extra="consul", title="Consul",
)
