"""Where exported services' endpoints come from: waypost's own resolvers, and etcd prefixes.

Each export's target (or list of targets) is resolved by the resolver a ``waypost.dial`` of it would use
(``make_resolver(..., ResolverOptions(blocking=False))``), so every registry waypost reads is a source, with
the resolvers' own behaviour on errors: a source that cannot be read keeps its last list.

A ``PrefixWatcher`` reads the service keys under a prefix of an etcd (or memory) registry every
``interval`` seconds and reports each key it has not seen before (a registration's key is
``SERVICE/ID``: the service is the part before the last ``/``). A service whose instances all went away
is not withdrawn (its export keeps its last list, like any other source).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ..discovery.formats import GOZERO_META_ROOT
from ..resolver import Resolver, ResolverOptions, make_resolver
from ..resolver.target import parse_target, parse_targets, target_for_registry
from ..types import Backend
from .exports import NAME_RE, Export

log = logging.getLogger("waypost.xds")


def start_source(export: Export, on_update: Callable[[str, Sequence[Backend]], None],
                 on_error: Callable[[str, str], None]) -> Resolver:
    """Start the resolver of ``export``'s target; ``on_update(name, backends)`` / ``on_error(name, message)``
    from any thread."""
    target = parse_target(export.target) if isinstance(export.target, str) else parse_targets(list(export.target))
    # quiet: the control plane logs what on_error reports, once per change of state (control.py)
    resolver = make_resolver(target, ResolverOptions(blocking=False, report_early=True, quiet=True))
    name = export.name
    resolver.start(lambda backends: on_update(name, backends), lambda message: on_error(name, message))
    return resolver


def services_under(keys: Sequence[str], prefix: str) -> set[str]:
    """The service keys among registration keys (``SERVICE/ID`` under ``prefix``) usable as xDS names."""
    out = set()
    for key in keys:
        if not key.startswith(prefix) or key.startswith((GOZERO_META_ROOT, "/")):
            continue
        service = key.rpartition("/")[0]
        if service.startswith(prefix) and NAME_RE.fullmatch(service):
            out.add(service)
    return out


class PrefixWatcher:
    """Reports each new service key under ``prefix`` in the registry at ``registry_url`` (module docstring).

    Runs as a task on the running loop (``start``), reading keys only, every ``interval`` seconds."""

    def __init__(self, registry_url: str, prefix: str, on_new: Callable[[str, str], None],
                 interval: float = 2.0) -> None:
        from ..discovery.connections import connect

        self.registry = connect(registry_url)
        self.prefix = prefix
        self.on_new = on_new
        self.interval = interval
        self.seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"xds-prefix-{self.prefix}")

    async def scan(self) -> set[str]:
        """One read: the services found now (the new ones reported)."""
        res = await asyncio.wait_for(self.registry.get(self.prefix, prefix=True, keys_only=True), 10.0)
        found = services_under([kv.key for kv in res.kvs], self.prefix)
        for service in sorted(found - self.seen):
            self.seen.add(service)
            log.info("xds: new service %r under prefix %r", service, self.prefix)
            self.on_new(service, target_for_registry(self.registry, service))
        return found

    async def _run(self) -> None:
        while True:
            try:
                await self.scan()
                if self._failing:
                    log.warning("xds: prefix %r readable again", self.prefix)
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 -- the registry is down: keep what was found, try again
                if not self._failing:
                    log.warning("xds: cannot list prefix %r (%s); services found so far stay exported",
                                self.prefix, e or type(e).__name__)
                self._failing = True
            await asyncio.sleep(self.interval)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
