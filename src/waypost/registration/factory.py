"""Which registration a registry gets.

``make_publisher(registry, key, address, ...)`` is what ``serve()`` uses:

- a registry of any kind (a URL, or a ``waypost.connect`` result) -> the kind's registration: its ``registrar``
  under the generic ``KindRegistration`` (``kind_table.py``); a keyed registry's URL is connected first (one
  shared connection per cluster), and its registrar keeps a key under a lease;
- a list of them -> ``MultiPublisher`` over one of each;
- None -> ``NoRegistration``: nothing is written anywhere (inside Kubernetes: the readiness probe decides).

Every one is a ``Registration`` (``registration.py``: start / stop / pause / resume / update_metadata /
check_metadata, their ``a*`` twins, ``key``, ``registered``, ``state``, ``outage``), so ``serve()``'s lifecycle is
the same whatever the registry.

``MultiPublisher`` (``multi.py``) says how several registries back each other up.
"""

from __future__ import annotations

from typing import Any

from ..discovery.subscriber import resolve_registry
from ..kind_table import kind_of, part
from .contract import Registration
from .multi import MultiPublisher
from .no_registry import NoRegistration

__all__ = ["MultiPublisher", "NoRegistration", "Registration", "connect_registries", "make_publisher"]


def _holds_instances(registry: Any) -> bool:
    """True for the URL of a kind that registers service instances; False for the keyed registries (their URLs,
    Registry objects; an unknown scheme too: ``connect`` names it)."""
    kind = kind_of(registry) if isinstance(registry, str) else None
    return kind is not None and kind.holds_instances


def connect_registries(registry: Any) -> Any:
    """What a publisher is made with: keyed registries' URLs connected (``waypost.connect``: one shared
    connection per cluster), lists member by member, the URLs of the kinds holding instances as they are (their
    registrations connect)."""
    if registry is None:
        return None
    if isinstance(registry, list | tuple):
        return [connect_registries(r) for r in registry]
    if isinstance(registry, str) and not _holds_instances(registry):
        from ..discovery.connections import connect

        return connect(registry)
    return registry


def make_publisher(registry: Any, key: str, address: str, **kw: Any) -> Registration:
    """The publisher for ``registry`` (a URL, a Registry, a list of them, or None: see the module docstring)."""
    if registry is None:
        return NoRegistration()
    if isinstance(registry, list | tuple):
        if not registry:
            raise ValueError("serve: registry=[] names no registry; give one or more URLs, or None for none")
        alerts = {k: kw.pop(k) for k in ("max_unregistered", "on_unregistered") if k in kw}
        members = [make_publisher(r, key, address, **kw) for r in registry]
        return MultiPublisher(members, timeout=kw.get("timeout", 5.0), **alerts)
    if not _holds_instances(registry):  # a keyed registry: its kind's registration over the shared connection
        registry = resolve_registry(registry)
    kind = kind_of(registry if isinstance(registry, str) else registry.url)
    assert kind is not None
    publisher: Registration = part(kind, "publisher")(registry, key, address, **kw)
    return publisher
