"""``connect(url)``: the process-wide shared ``Registry`` for a URL of a keyed kind (``kind_table.py``: its
``parse_url`` reads the URL, its ``registry`` makes the store), e.g. ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&...]``
or ``memory://[name]``. Creation is single-flight and never touches the network; the first call on an unreachable
registry raises ``RegistryUnavailable``. After ``fork()`` a child gets fresh objects.
"""

from __future__ import annotations

import os
import threading

from ..kind_table import part
from .registry_url import keyed_kind
from .store import Registry

__all__ = ["connect"]


_lock = threading.Lock()
_cache: dict[tuple[object, ...], Registry] = {}


def connect(url: str) -> Registry:
    """The shared Registry for ``url`` (same endpoint set, user and TLS files -> same object).

    Raises ``waypost.InvalidTarget`` for a malformed URL (the message names the problem and shows
    an example). Closing the registry removes it from the cache.
    """
    kind = keyed_kind(url)
    parsed = part(kind, "parse_url")(url.strip())
    key = (os.getpid(), *parsed.cache_key())
    reg = _cache.get(key)
    if reg is not None:
        return reg
    with _lock:
        reg = _cache.get(key)
        if reg is None:
            reg = part(kind, "registry")(parsed)
            _cache[key] = reg
            _register_close(reg, key)
        return reg


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
