"""etcd / discov / memory targets: the backend list from a registry key, through ``waypost.Subscriber``.

The Subscriber keeps a local cache fed by a watch on the control loop; every change calls our listener
there, and the (subset) backend list goes to the channel. The registry connection is shared per endpoint
set by ``waypost.connect`` and is not closed here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..balancer.base import Backend
from .subset import Subsetter
from .target import Target

log = logging.getLogger("waypost.resolver")


class RegistryResolver:
    def __init__(self, target: Target, subsetter: Subsetter | None) -> None:
        self.target = target
        self.subsetter = subsetter
        self._sub: Any = None
        self._closed = False

    def start(self, on_update: Callable[[Sequence[Backend]], None], on_error: Callable[[str], None]) -> None:
        from ..discovery import Subscriber
        from ..registry import connect

        registry = connect(self.target.registry_url())
        # The Subscriber returns after its initial load (raises RegistryUnavailable when it cannot).
        self._sub = sub = Subscriber(registry, self.target.key, exact=self.target.exact, format=self.target.format)

        def changed() -> None:
            if self._closed:
                return
            backends: Sequence[Backend] = sub.backends()
            if self.subsetter is not None:
                backends = self.subsetter.select(backends)
            log.debug("waypost: %s -> %d backends", self.target.redacted, len(backends))
            on_update(backends)

        sub.add_listener(changed)
        changed()

    def backends(self) -> Sequence[Backend]:
        return tuple(self._sub.backends()) if self._sub is not None else ()

    def close(self) -> None:
        self._closed = True
        if self._sub is not None:
            self._sub.close()
