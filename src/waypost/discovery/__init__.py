"""Discovery: Publisher (server side) and Subscriber (client side) over a Registry.

go-zero's ``core/discov`` semantics, with metadata, never-ending re-registration, and value changes
applied on every path. Wire formats live in ``waypost.registry.formats``.
"""

from __future__ import annotations

from typing import Any

from .container import Container
from .registration_contract import Registration
from .subscriber import Subscriber, active_subscriptions


def __getattr__(name: str) -> Any:
    # the etcd kind's registration, loaded on first use (it imports this package's parts)
    if name == "Publisher":
        from ..registries.etcd.registrar import Publisher

        return Publisher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Container", "Publisher", "Registration", "Subscriber", "active_subscriptions"]
