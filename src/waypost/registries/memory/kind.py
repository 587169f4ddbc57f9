"""The memory kind's row: ``waypost.connect("memory://NAME")`` is a handle on the process' store NAME, and
``memory://NAME/?key=K`` targets are read by etcd's ``KeyedDiscovery`` (through a ``waypost.Subscriber``)."""

from __future__ import annotations

from ...kind_table import RegistryKind, Words
from ..etcd.kind import KEYED_WORDS

_HERE = "waypost.registries.memory."

KIND = RegistryKind(
    "memory", None, "memory:///?key=greet.rpc", "memory://default",
    parse_url=_HERE + "config:parse_memory_url", registry=_HERE + "store:from_url",
    parse_target=_HERE + "config:parse_memory_target", target_params=("key", "format", "exact"),
    target_registry_url=_HERE + "config:registry_url",
    console_source="waypost.registries.etcd.console:KeyedSource",
    discovery="waypost.registries.etcd.discovery:KeyedDiscovery",
    registrar="waypost.registries.etcd.registrar:EtcdRegistrar",
    words=Words(read_failed="{error}", no_list="{why}", **KEYED_WORDS),
    override_store="waypost.registries.etcd.overrides:from_url",
)
