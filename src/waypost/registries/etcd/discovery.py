"""The keyed kinds' ``waypost.kinds.Discovery`` (etcd's, memory's): the records under a target's key, in the wire
format of its ``format=`` parameter (go-zero's, grpc-go's etcd naming, Kratos'), with go-zero's metadata side
records joined.

``watch`` follows the key through a ``waypost.Subscriber`` (the process' shared reader of that key: one Get, one
Watch, whatever the number of channels; ``cache=PATH`` honoured); ``instances`` makes one read of its own (never
the shared reader's list), so that it fails while the registry cannot be read. A first read that fails raises
``RegistryUnavailable`` with the registry's own account of why, cause first (``etcd at 127.0.0.1:2379
unreachable: connection refused (could not read the key 'greet' within 5s; ...)``); ``diagnose`` gives that
account alone, for the early report of an aio dial.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ... import _loop
from ...discovery import Subscriber
from ...discovery.formats import get_format
from ...discovery.shared_reader import SharedReader
from ...discovery.subscriber import resolve_registry
from ...kinds import Backend, Backoff, Discovery, RegistryUnavailable, Target

#: how long asking the registry why it cannot be reached may take, seconds
PROBE_LIMIT = 2.0
#: a key's internal side records (go-zero metadata), never named in messages
_INTERNAL_KEY = re.compile(r"'_waypost/[^']*'")


async def _on_control(coro: Any) -> Any:
    """``coro`` run on waypost's control loop (where the registries live), awaited from any loop."""
    if _loop.in_loop():
        return await coro
    return await asyncio.wrap_future(_loop.submit(coro))


class KeyedDiscovery(Discovery):
    """The instances under ``target.key`` in the keyed registry the target names (``Target.registry_url``)."""

    #: the bound of one read (the first list of a watch, an ``instances`` read), seconds
    read_timeout: float = 5.0
    #: each read is bounded by ``read_timeout`` already: the pauses between them are short, so that a channel
    #: waiting for its first list is not kept waiting long once etcd is back
    backoff = Backoff(first=0.5, cap=5.0, jitter=0.0)

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
        try:
            sub = await Subscriber.open(self.target.registry_url(), service, exact=self.target.exact,
                                        format=self.target.format, timeout=self.read_timeout,
                                        cache_file=self.target.cache_file)
        except (RegistryUnavailable, OSError) as e:
            raise RegistryUnavailable(self._failure_text(service, e, await self.diagnose(service))) from e
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

    async def diagnose(self, service: str) -> str | None:
        """The registry's own account of why it cannot be reached (``etcd at h:2379 unreachable: connection
        refused``), within ``PROBE_LIMIT``; None when it can, or cannot say."""
        try:
            why: str | None = await asyncio.wait_for(
                _on_control(resolve_registry(self.target.registry_url()).unreachable()), PROBE_LIMIT)
        except Exception:  # noqa: BLE001 -- a diagnosis only
            return None
        return why

    def _failure_text(self, service: str, e: BaseException, why: str | None) -> str:
        """Why the first read failed, cause first: the unreachable endpoints and why, then what could not be read;
        never waypost's internal keys."""
        what = f"could not read the key {service!r} within {self.read_timeout:g}s"
        if why is not None:
            return f"{why} ({what}; is etcd running there? `waypost etcd` starts one)"
        text = _INTERNAL_KEY.sub("its metadata records", str(e)) or type(e).__name__
        return text if text.startswith("could not read") else f"{what}: {text}"
