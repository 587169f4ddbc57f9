"""Resolvers: a dial target -> the backend list, pushed to the channel as it changes.

The contract (``resolver.base``): a resolver is built as ``SomeResolver(target, ResolverOptions)`` and
implements ``Resolver``: ``start(on_update, on_error)``, ``resolve_now(reason)``, ``close()`` and
``aclose()``. ``make_resolver(target, options)`` picks one by scheme.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidTarget
from ..registry.kinds import lookup, part
from .base import OnError, OnUpdate, Resolver, ResolverFactory, ResolverOptions
from .direct import DirectResolver
from .multi import MultiResolver
from .registry_resolver import RegistryResolver
from .subset import DEFAULT_SUBSET_SIZE, Subsetter, deterministic_subset
from .target import Target, parse_target, parse_targets

if TYPE_CHECKING:
    from .consul import ConsulResolver
    from .dns import DnsResolver
    from .k8s import K8sResolver
    from .zk import ZkResolver


def __getattr__(name: str) -> Any:
    # the resolvers of registry kinds load with their kind (a target of theirs, or a name asked for here);
    # plain imports, so that the layer checks see them
    if name == "ConsulResolver":
        from .consul import ConsulResolver

        return ConsulResolver
    if name == "DnsResolver":
        from .dns import DnsResolver

        return DnsResolver
    if name == "K8sResolver":
        from .k8s import K8sResolver

        return K8sResolver
    if name == "ZkResolver":
        from .zk import ZkResolver

        return ZkResolver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolver_factory(scheme: str) -> ResolverFactory:
    """The resolver class of a target scheme (``multi``: several targets as one; any other: its registry kind's,
    ``registry/kinds.py``, loaded on first use)."""
    if scheme == "multi":
        return MultiResolver
    kind = lookup(scheme)
    if kind is None or kind.resolver is None:
        raise InvalidTarget(f"no resolver for scheme {scheme!r}")
    factory: ResolverFactory = part(kind, "resolver")
    return factory


def make_resolver(target: Target | str, options: ResolverOptions | None = None) -> Resolver:
    """The resolver for ``target`` (a string is parsed first), built with ``options`` (defaults if None)."""
    if isinstance(target, str):
        target = parse_target(target)
    try:
        factory = resolver_factory(target.scheme)
    except InvalidTarget:
        raise InvalidTarget(f"no resolver for scheme {target.scheme!r}: {target.redacted}") from None
    return factory(target, options)


__all__ = [
    "DEFAULT_SUBSET_SIZE",
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
    "resolver_factory",
]
