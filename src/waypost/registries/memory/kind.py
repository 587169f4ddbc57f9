"""The memory kind's row: ``waypost.connect("memory://NAME")`` is a handle on the process' store NAME, and
``memory://NAME/?key=K`` targets are read through a ``waypost.Subscriber`` like etcd's."""

from __future__ import annotations

from ...kind_table import RegistryKind, Words
from ..etcd.kind import KEYED_WORDS

_HERE = "waypost.registries.memory."

KIND = RegistryKind(
    "memory", None, "memory:///?key=greet.rpc", "memory://default", keyed=True,
    parse_url=_HERE + "config:parse_memory_url", registry=_HERE + "store:from_url",
    parse_target=_HERE + "config:parse_memory_target", target_params=("key", "format", "exact"),
    target_registry_url=_HERE + "config:registry_url", resolver="waypost.registries.etcd.resolver:RegistryResolver",
    discovery="waypost.registries.etcd.discovery:KeyedDiscovery",
    registrar="waypost.registries.etcd.registrar:EtcdRegistrar", words=Words(**KEYED_WORDS),
    override_store="waypost.registries.etcd.overrides:from_url",
)
