"""Resolvers: a dial target -> the backend list, pushed to the channel as it changes.

The contract (``resolver.base``): a resolver is built as ``SomeResolver(target, ResolverOptions)`` and
implements ``Resolver``: ``start(on_update, on_error)``, ``resolve_now(reason)``, ``close()`` and
``aclose()``. ``make_resolver(target, options)`` picks one by scheme: ``multi`` (several targets), else the
resolver of every registry kind (``waypost.kinds.resolver.KindResolver``) over the target's kind's ``Discovery``
(``kind_table.py``; each kind's discovery lives in its package under ``waypost.registries``).
"""

from __future__ import annotations

from ..errors import InvalidTarget
from ..kind_table import lookup, part
from .base import OnError, OnUpdate, Resolver, ResolverFactory, ResolverOptions
from .multi import MultiResolver
from .subset import DEFAULT_SUBSET_SIZE, Subsetter, deterministic_subset
from .target import Target, parse_target, parse_targets


def resolver_factory(scheme: str) -> ResolverFactory:
    """The resolver class of a target scheme (``multi``: several targets as one; any other: the generic resolver
    bound to its registry kind, ``kind_table.py``, loaded on first use)."""
    if scheme == "multi":
        return MultiResolver
    kind = lookup(scheme)
    if kind is None or kind.discovery is None:
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
    "MultiResolver",
    "OnError",
    "OnUpdate",
    "Resolver",
    "ResolverFactory",
    "ResolverOptions",
    "Subsetter",
    "Target",
    "deterministic_subset",
    "make_resolver",
    "parse_target",
    "parse_targets",
    "resolver_factory",
]
