"""The kinds of registry waypost knows, in one table: what each URL scheme means, its default port, its URL
parser, the pip extra it needs and an example.

A kind is a URL scheme (``etcd``, ``memory``, ``consul``, ``zk``, ``eureka``, ``k8s``, ``dns``, ``direct``). Two
families:

- *keyed* kinds (etcd, memory) hold keys under leases: the ``Registry`` contract of ``registry/base.py``.
  ``waypost.connect`` takes their URLs (parsed by ``registry/url.py``) and every wire format works on them.
- the other kinds hold something else: Consul's catalog and ZooKeeper's Kratos layout hold service instances
  (registered with their own publishers; their URLs are parsed by ``consul/config.py`` and ``zk/config.py``),
  Kubernetes' EndpointSlices, DNS and fixed addresses are only read (dial targets, no registry URL).

Which publisher (``discovery/``) and which resolver (``resolver/``) serve a kind live in those layers, keyed by
the same scheme names; except for a kind with a ``package`` (Eureka): that package holds everything of the kind
above the generic layers, which reach it by name only (``plugin``), through ``parse_registry_url``, the class named
by ``publisher``, ``new_resolver`` and ``new_console_source``. The grammar of dial targets, aliases included (``discov:`` is etcd; gRPC's ``ipv4:`` and
``ipv6:`` are direct), is ``resolver/target.py``'s.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..consul import config as consul_config
from ..zk import config as zk_config


@dataclass(frozen=True)
class RegistryKind:
    """One kind of registry (see the module docstring)."""

    scheme: str
    #: the port of a host named without one, in its URLs and dial targets (None: they name no host:port)
    default_port: int | None
    #: a dial target of this kind
    target_example: str
    #: a registry URL of this kind (None: no registry URL: a kind that is only read)
    url_example: str | None = None
    #: keys under leases (the Registry contract): ``waypost.connect`` takes the URL
    keyed: bool = False
    #: the URL -> settings parser of a kind that is not keyed (keyed ones: ``registry.url.parse_registry_url``)
    parse_url: Callable[[str], object] | None = None
    #: the waypost name a service registers through, beside ``serve(registry=URL)`` (kinds that hold instances)
    publisher: str | None = None
    #: the pip extra the kind needs (``pip install 'waypost[EXTRA]'``); None: nothing beyond waypost itself
    extra: str | None = None
    #: other schemes of dial targets that mean this kind
    aliases: tuple[str, ...] = ()
    #: the package that implements the whole kind, imported by name on first use (``plugin``)
    package: str | None = None

    @property
    def install_hint(self) -> str:
        """How to get what the kind needs, e.g. ``pip install 'waypost[zk]'`` ("" when nothing)."""
        return f"pip install 'waypost[{self.extra}]'" if self.extra else ""


#: every kind by scheme, in the order messages list them
KINDS: dict[str, RegistryKind] = {k.scheme: k for k in (
    RegistryKind("direct", None, "direct:///127.0.0.1:8080,127.0.0.1:8081"),
    RegistryKind("etcd", 2379, "etcd:///127.0.0.1:2379?key=greet.rpc",
                 "etcd://user:secret@127.0.0.1:2379,10.0.0.2:2379?tls=1&ca=/etc/etcd/ca.pem&dial_timeout=3",
                 keyed=True, aliases=("discov",)),
    RegistryKind("memory", None, "memory:///?key=greet.rpc", "memory://default", keyed=True),
    # 443: gRPC's port of a name given without one; dnspython only for a DNS server named in the target
    RegistryKind("dns", 443, "dns:///greet.example.com:8080", extra="dns"),
    RegistryKind("k8s", None, "k8s://default/greet:50051", extra="k8s"),
    RegistryKind("consul", consul_config.CONSUL_DEFAULT_PORT, "consul://127.0.0.1:8500/greet",
                 consul_config.CONSUL_EXAMPLE, parse_url=consul_config.parse_registry_url,
                 publisher="ConsulPublisher", extra="consul"),
    RegistryKind("zk", zk_config.DEFAULT_PORT, "zk://127.0.0.1:2181/greet", zk_config.EXAMPLE,
                 parse_url=zk_config.parse_registry_url, publisher="ZkPublisher", extra="zk"),
    RegistryKind("eureka", 8761, "eureka://127.0.0.1:8761/greeter",
                 "eureka://10.0.0.1:8761,10.0.0.2:8761?path=/eureka",
                 parse_url=lambda url: plugin("eureka").parse_registry_url(url), publisher="EurekaPublisher",
                 extra="eureka", package="waypost.eureka"),
)}

#: every scheme that names a kind, its aliases included, in the order messages list them
SCHEMES: dict[str, RegistryKind] = {s: k for k in KINDS.values() for s in (k.scheme, *k.aliases)}
#: the schemes whose URLs ``waypost.connect`` takes
KEYED = tuple(k.scheme for k in KINDS.values() if k.keyed)
#: the schemes that hold service instances registered through their own publishers
INSTANCE_REGISTRIES = tuple(k.scheme for k in KINDS.values() if k.publisher)


def scheme_of(url: str) -> str:
    """The scheme of a URL, lower case ("" when it has no ``://``)."""
    scheme, sep, _ = url.strip().partition("://")
    return scheme.lower() if sep else ""


def kind_of(url: str) -> RegistryKind | None:
    """The kind a URL or dial target names by its scheme (an alias too); None for any other."""
    return SCHEMES.get(scheme_of(url))



def plugin(scheme: str) -> Any:
    """The package of a kind that has one (``RegistryKind.package``), imported now if it was not yet."""
    package = KINDS[scheme].package
    if package is None:
        raise LookupError(f"the {scheme} kind has no package of its own")
    return importlib.import_module(package)
