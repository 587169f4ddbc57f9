"""The direct kind's ``waypost.kinds.Discovery``: the target's addresses, as they are."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from ...kinds import Backend, Discovery, Target


class DirectDiscovery(Discovery):
    """The addresses of a ``direct:///a:1,b:2`` target: one list, never changed; nothing to re-read."""

    def __init__(self, target: Target) -> None:
        self.backends = tuple(Backend(a) for a in target.endpoints)

    def describe(self, service: str) -> str:
        return "the addresses given"

    async def instances(self, service: str) -> Sequence[Backend]:
        return self.backends

    async def watch(self, service: str) -> AsyncIterator[Sequence[Backend]]:
        yield self.backends
        await asyncio.Event().wait()  # the list never changes: the watch lasts until the channel closes
