"""The keyed kinds' ``waypost.kinds.Discovery`` (etcd's, memory's): the records under a target's key, in the wire
format of its ``format=`` parameter (go-zero's, grpc-go's etcd naming, Kratos'), with go-zero's metadata side
records joined.

``watch`` follows the key through a ``waypost.Subscriber`` (the process' shared reader of that key: one Get, one
Watch, whatever the number of channels; ``cache=PATH`` honoured); ``instances`` makes one read of its own (never
the shared reader's list), so that it fails while the registry cannot be read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from ... import _loop
from ...discovery import Subscriber
from ...discovery.formats import get_format
from ...discovery.shared_reader import SharedReader
from ...discovery.subscriber import resolve_registry
from ...kinds import Backend, Discovery, Target

T = TypeVar("T")


async def _on_control(coro: Any) -> Any:
    """``coro`` run on waypost's control loop (where the registries live), awaited from any loop."""
    if _loop.in_loop():
        return await coro
    return await asyncio.wrap_future(_loop.submit(coro))


class KeyedDiscovery(Discovery):
    """The instances under ``target.key`` in the keyed registry the target names (``Target.registry_url``)."""

    #: the bound of one read (the first list of a watch, an ``instances`` read), seconds
    read_timeout: float = 5.0

    def __init__(self, target: Target) -> None:
        if not target.key:
            raise ValueError(f"registry target without a key: {target.redacted}")
        self.target = target

    def describe(self, service: str) -> str:
        return f"key {service!r}"

    async def instances(self, service: str) -> Sequence[Backend]:
        backends: Sequence[Backend] = await _on_control(self._read(service))
        return backends

    async def _read(self, service: str) -> Sequence[Backend]:
        reader = SharedReader(resolve_registry(self.target.registry_url()), service, self.target.exact,
                              get_format(self.target.format))
        try:
            container = await reader.attach(False, self.read_timeout)
            return container.backends()
        finally:
            reader.close()

    async def watch(self, service: str) -> AsyncIterator[Sequence[Backend]]:
        sub = await Subscriber.open(self.target.registry_url(), service, exact=self.target.exact,
                                    format=self.target.format, timeout=self.read_timeout,
                                    cache_file=self.target.cache_file)
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def fire() -> None:  # on the control loop: wake this loop's iterator
            loop.call_soon_threadsafe(changed.set)

        sub.add_listener(fire)
        try:
            while True:
                changed.clear()
                yield sub.backends()
                await changed.wait()
        finally:
            sub.remove_listener(fire)
            await sub.aclose()
