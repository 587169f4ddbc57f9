"""Resolvers: a dial target -> the backend list, pushed to the channel as it changes.

A resolver has ``start(on_update, on_error)`` (``on_update(backends)`` with the current list at once and
after every change, from any thread; ``on_error(message)`` when resolution fails but the last list stays)
and ``close()``. ``make_resolver(target)`` picks one by scheme.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import InvalidTarget
from ..types import Backend
from .direct import DirectResolver
from .dns import DnsResolver
from .registry_resolver import RegistryResolver
from .subset import DEFAULT_SUBSET_SIZE, Subsetter, deterministic_subset
from .target import Target, parse_target


class Resolver(Protocol):
    def start(self, on_update: Callable[[Sequence[Backend]], None], on_error: Callable[[str], None]) -> None: ...

    def close(self) -> None: ...


def make_resolver(target: Target | str, *, subsetter: Subsetter | None = None) -> Resolver:
    """The resolver for ``target`` (a string is parsed first). Registry targets are subset with ``subsetter``."""
    if isinstance(target, str):
        target = parse_target(target)
    if target.scheme == "direct":
        return DirectResolver(target)
    if target.scheme in ("etcd", "memory"):
        return RegistryResolver(target, subsetter)
    if target.scheme == "dns":
        return DnsResolver(target, subsetter)
    raise InvalidTarget(f"no resolver for scheme {target.scheme!r}: {target.redacted}")


__all__ = [
    "DEFAULT_SUBSET_SIZE",
    "DirectResolver",
    "DnsResolver",
    "RegistryResolver",
    "Resolver",
    "Subsetter",
    "Target",
    "deterministic_subset",
    "make_resolver",
    "parse_target",
]
