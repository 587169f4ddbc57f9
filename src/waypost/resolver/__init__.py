"""Resolvers: a dial target -> the backend list, pushed to the channel as it changes.

The contract (``resolver.base``): a resolver is built as ``SomeResolver(target, ResolverOptions)`` and
implements ``Resolver``: ``start(on_update, on_error)``, ``resolve_now(reason)``, ``close()`` and
``aclose()``. ``make_resolver(target, options)`` picks one by scheme (a kind with a package of its own, such as
Eureka, gives its ``new_resolver`` factory: ``registry.kinds.plugin``).
"""

from __future__ import annotations

from ..errors import InvalidTarget
from ..registry.kinds import KINDS, plugin
from .base import OnError, OnUpdate, Resolver, ResolverFactory, ResolverOptions
from .consul import ConsulResolver
from .direct import DirectResolver
from .dns import DnsResolver
from .k8s import K8sResolver
from .multi import MultiResolver
from .registry_resolver import RegistryResolver
from .subset import DEFAULT_SUBSET_SIZE, Subsetter, deterministic_subset
from .target import Target, parse_target, parse_targets
from .zk import ZkResolver

#: The resolver class for each target scheme.
RESOLVERS: dict[str, ResolverFactory] = {
    "direct": DirectResolver,
    "etcd": RegistryResolver,
    "memory": RegistryResolver,
    "dns": DnsResolver,
    "k8s": K8sResolver,
    "consul": ConsulResolver,
    "multi": MultiResolver,
    "zk": ZkResolver,
}


def make_resolver(target: Target | str, options: ResolverOptions | None = None) -> Resolver:
    """The resolver for ``target`` (a string is parsed first), built with ``options`` (defaults if None)."""
    if isinstance(target, str):
        target = parse_target(target)
    factory = RESOLVERS.get(target.scheme)
    kind = KINDS.get(target.scheme)
    if factory is None and kind is not None and kind.package:
        factory = plugin(kind.scheme).new_resolver
    if factory is None:
        raise InvalidTarget(f"no resolver for scheme {target.scheme!r}: {target.redacted}")
    return factory(target, options)


__all__ = [
    "DEFAULT_SUBSET_SIZE",
    "RESOLVERS",
    "ConsulResolver",
    "DirectResolver",
    "DnsResolver",
    "K8sResolver",
    "MultiResolver",
    "OnError",
    "OnUpdate",
    "RegistryResolver",
    "Resolver",
    "ResolverFactory",
    "ResolverOptions",
    "Subsetter",
    "Target",
    "ZkResolver",
    "deterministic_subset",
    "make_resolver",
    "parse_target",
    "parse_targets",
]
