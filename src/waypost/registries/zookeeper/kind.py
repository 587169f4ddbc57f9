"""The ZooKeeper kind: ``zk://H1:2181,H2:2181`` registries (ephemeral nodes in Kratos' layout) and
``zk://H1:2181/SERVICE`` targets. docs/zookeeper.md."""

from __future__ import annotations

from ...registry.kinds import RegistryKind
from .config import DEFAULT_PORT, EXAMPLE

_HERE = "waypost.registries.zookeeper."

KIND = RegistryKind(
    "zk", DEFAULT_PORT, "zk://127.0.0.1:2181/greet", EXAMPLE,
    parse_url=_HERE + "config:parse_registry_url", publisher=_HERE + "publisher:ZkPublisher",
    resolver=_HERE + "resolver:ZkResolver", console_source=_HERE + "console:ZkSource",
    override_store=_HERE + "store:ZkOverrides", target_params=("namespace", "session_timeout"),
    extra="zk", title="ZooKeeper",
)
