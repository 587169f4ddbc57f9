"""Registries: ``connect(url)`` returns the process-wide shared Registry for a URL.

``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...&dial_timeout=3]`` and
``memory://[name]``. Creation is single-flight and never touches the network; the first call on
an unreachable etcd raises ``RegistryUnavailable``. After ``fork()`` a child gets fresh objects.

The package imports its modules when first used, so that ``waypost.registry.formats`` or
``waypost.registry.kinds`` alone (the command line's option lists) does not load the etcd client and gRPC.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Registry, SyncRegistry
    from .url import RegistryURL, parse_registry_url

__all__ = ["Registry", "RegistryURL", "SyncRegistry", "connect", "parse_registry_url"]


def __getattr__(name: str) -> Any:
    # plain imports (not importlib), so that the layer checks see them
    if name in ("Registry", "SyncRegistry"):
        from . import base

        return getattr(base, name)
    if name in ("RegistryURL", "parse_registry_url"):
        from . import url

        return getattr(url, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_lock = threading.Lock()
_cache: dict[tuple[object, ...], Registry] = {}


def connect(url: str) -> Registry:
    """The shared Registry for ``url`` (same endpoint set, user and TLS files -> same object).

    Raises ``waypost.InvalidTarget`` for a malformed URL (the message names the problem and shows
    an example). Closing the registry removes it from the cache.
    """
    from .url import parse_registry_url

    parsed = parse_registry_url(url)
    key = (os.getpid(), *parsed.cache_key())
    reg = _cache.get(key)
    if reg is not None:
        return reg
    with _lock:
        reg = _cache.get(key)
        if reg is None:
            reg = _create(parsed)
            _cache[key] = reg
            _register_close(reg, key)
        return reg


def _create(parsed: RegistryURL) -> Registry:
    if parsed.scheme == "memory":
        from .memory import MemoryRegistry  # written alongside; imported lazily

        return MemoryRegistry(parsed.name)
    from .etcd import EtcdRegistry

    assert parsed.config is not None  # an etcd URL always carries its settings
    return EtcdRegistry(parsed.config, parsed.redacted)


def _register_close(reg: Registry, key: tuple[object, ...]) -> None:
    def forget(_: object = None) -> None:
        with _lock:
            if _cache.get(key) is reg:
                del _cache[key]

    hooks = getattr(reg, "_on_close", None)
    if isinstance(hooks, list):
        hooks.append(forget)
        return
    # a registry without close hooks: wrap its close()
    orig = reg.close

    async def close() -> None:
        forget()
        await orig()

    reg.close = close  # type: ignore[method-assign]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _cache.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
