"""The ZooKeeper kind: ``zk://H1:2181,H2:2181`` registries (ephemeral nodes in Kratos' layout) and
``zk://H1:2181/SERVICE`` targets. docs/zookeeper.md."""

from __future__ import annotations

from ...kinds import RegistryKind, Words
from .config import DEFAULT_PORT, EXAMPLE

_HERE = "waypost.registries.zookeeper."

KIND = RegistryKind(
    "zk", DEFAULT_PORT, "zk://127.0.0.1:2181/greet", EXAMPLE,
    parse_url=_HERE + "config:parse_registry_url", registrar=_HERE + "registrar:ZkRegistrar",
    discovery=_HERE + "discovery:ZkDiscovery", console_source=_HERE + "console:ZkSource",
    override_store=_HERE + "overrides:ZkOverrides", target_params=("namespace", "session_timeout"),
    extra="zk", title="ZooKeeper",
    words=Words(instance="node", renewal="a session check", read_failed="zk: reading {what} failed: {error}",
                left_behind="could not delete {instance} {id!r} (it goes when its session ends)"),
)
