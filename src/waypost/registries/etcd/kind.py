"""The etcd kind's row: ``waypost.connect("etcd://...")`` makes its ``EtcdRegistry``, ``etcd:///HOSTS?key=K``
(and go-zero's ``discov://``) targets are read by its ``KeyedDiscovery`` (through a ``waypost.Subscriber``)."""

from __future__ import annotations

from ...kind_table import RegistryKind, Words

_HERE = "waypost.registries.etcd."

#: what the registration of a keyed kind (etcd, memory) says: the lease names the instance unless ``serve(id=)``
KEYED_WORDS = {"renewal": "a lease keep-alive", "id_format": "",
               "left_behind": "could not revoke the lease of this {instance} (it expires within {ttl}s)"}

KIND = RegistryKind(
    "etcd", 2379, "etcd:///127.0.0.1:2379?key=greet.rpc",
    "etcd://user:secret@127.0.0.1:2379,10.0.0.2:2379?tls=1&ca=/etc/etcd/ca.pem&dial_timeout=3",
    aliases=("discov",), credentials=True,
    parse_url=_HERE + "config:parse_etcd_url", registry=_HERE + "store:from_url",
    parse_target=_HERE + "target:parse_etcd_target",
    target_params=("key", "format", "exact", "cache", "user", "password", "tls", "cacert", "certfile", "keyfile",
                   "dial_timeout", "request_timeout"),
    target_registry_url=_HERE + "target:registry_url",
    misdial=_HERE + "misdial:meant_target",
    # a failed read says it all, cause first (``etcd at h:2379 unreachable: ...``): no prefix
    words=Words(misdialed="this looks like an etcd endpoint: did you mean {target} (the key the servers register "
                          "under)?", read_failed="{error}", no_list="{why}", **KEYED_WORDS),
    console_source=_HERE + "console:KeyedSource",
    discovery=_HERE + "discovery:KeyedDiscovery", registrar=_HERE + "registrar:EtcdRegistrar",
    override_store=_HERE + "overrides:from_url",
)
