"""Discovery over the keyed registries (etcd, memory): the store contract they implement (``store.py``), the wire
formats of their records (``formats.py``: go-zero's, grpc-go's etcd naming, Kratos'), ``connect(url)``
(``connections.py``), the override records (``override.py``), and reading them: ``Subscriber`` (client side,
go-zero's ``core/discov`` semantics with metadata, a cache file and stale reads). The server side's registration is
``waypost.Publisher`` (the etcd kind's, ``waypost.registries.etcd.registrar``), on the registration machinery every
kind's runs on (``waypost.registration``).

The package imports its modules when first used, so that ``waypost.discovery.formats`` alone (the command line's
option lists) does not load a registry's client and gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connections import connect
    from .container import Container
    from .store import Registry, SyncRegistry
    from .subscriber import Subscriber, active_subscriptions

__all__ = ["Container", "Registry", "Subscriber", "SyncRegistry", "active_subscriptions", "connect"]


#: where each name lives (its module imported on first use)
_HOMES = {"connect": "connections", "Container": "container", "Registry": "store", "SyncRegistry": "store", "Subscriber": "subscriber",
          "active_subscriptions": "subscriber"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
