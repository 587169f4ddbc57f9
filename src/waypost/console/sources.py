"""What feeds the console's board besides the registries (each kind's console source, ``RegistryKind.console_source``):

``TargetSource``: a dial target (``k8s://``, ``consul://``, ``zk://``, ``dns:///``...) followed through its
resolver, as ``waypost watch TARGET`` does; shown read-only (drain acts on the registrations of keyed registries and of the kinds with an override store).

Registry calls and subscribers live on waypost's control loop; their results come back to the console's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _loop
from .board import Board, Instance, Service

if TYPE_CHECKING:
    from ..resolver import Resolver

log = logging.getLogger("waypost.console")
T = TypeVar("T")

#: pause after a failed read or watch of a registry (the sources of every kind)
RETRY_INTERVAL = 1.0


async def on_control(coro: Awaitable[T]) -> T:
    """Run ``coro`` on waypost's control loop and await it from the console's loop."""
    return await asyncio.wrap_future(_loop.submit(coro))


class TargetSource:
    """A dial target followed through its resolver (read-only). ``source`` and ``fmt``: what the page shows
    as its source and format (default: the target itself, ``resolver``). A target whose resolver gives no first
    list (its source unreachable) is shown with the error and tried again every ``REOPEN_INTERVAL`` s; a
    malformed target raises at once."""

    REOPEN_INTERVAL = 5.0

    def __init__(self, target: str, board: Board, timeout: float = 5.0, *, source: str | None = None,
                 fmt: str = "resolver", writable: bool = False) -> None:
        self.target = target
        self.board = board
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._resolver: Resolver | None = None
        self._reopen: asyncio.Task[None] | None = None
        self._closed = False
        shown, key = _target_names(target)
        self.service = Service(source or shown, key, fmt, writable)

    async def start(self) -> None:
        self.board.services[self.service.id] = self.service
        try:
            await self._open()
        except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
            self._error(str(e) or type(e).__name__)
            self._reopen = asyncio.create_task(self._open_later(), name="waypost-console-target")

    async def _open(self) -> None:
        from ..lookup import follow

        resolver = await asyncio.to_thread(
            follow, self.target, lambda now, _where: self._post(now, True), lambda now: self._post(now, False),
            self._post_error, timeout=self.timeout)
        if self._closed:
            await asyncio.to_thread(resolver.close)
            return
        self._resolver = resolver

    async def _open_later(self) -> None:
        while not self._closed and self._resolver is None:
            await asyncio.sleep(self.REOPEN_INTERVAL)
            try:
                await self._open()
            except Exception as e:  # noqa: BLE001 (shown on the page; tried again)
                self._error(str(e) or type(e).__name__)

    def _post(self, now: dict[str, dict[str, Any]], at_start: bool) -> None:
        self._loop.call_soon_threadsafe(self._update, now, at_start)

    def _update(self, now: dict[str, dict[str, Any]], at_start: bool) -> None:
        t = time.time()
        old = self.service.instances
        self.service.instances = {a: Instance(a, dict(m), old[a].first_seen if a in old else t,
                                              old[a].at_start if a in old else at_start) for a, m in now.items()}
        self.service.error = None
        self.board.touch()

    def _post_error(self, message: str) -> None:
        self._loop.call_soon_threadsafe(self._error, message)

    def _error(self, message: str) -> None:
        self.service.error = message
        self.board.touch()

    async def close(self) -> None:
        self._closed = True
        if self._reopen is not None:
            self._reopen.cancel()
        if self._resolver is not None:
            await asyncio.to_thread(self._resolver.close)
        self.board.services.pop(self.service.id, None)
        self.board.touch()


def _target_names(target: str) -> tuple[str, str]:
    """(source, key) shown for a target: the target with any password hidden, and its key or endpoints."""
    from ..resolver import parse_target

    t = parse_target(target)  # a bad target: the error names what is wrong
    return t.redacted, t.key or ",".join(t.endpoints) or t.redacted


#: the most services a catalog source (Consul, ZooKeeper) follows at once
MAX_SERVICES = 500


async def follow_services(services: dict[str, TargetSource], names: Sequence[str], board: Board, *,
                          target: Callable[[str], str], source: str, fmt: str, timeout: float,
                          closed: Callable[[], bool] = lambda: False) -> None:
    """Make ``services`` (name -> its TargetSource) follow the catalog's ``names``: the ones gone are closed, the
    new ones started (at most ``MAX_SERVICES``; ``target(name)`` is the dial target of one); one that cannot be
    started is shown with its error."""
    for gone in set(services) - set(names):
        await services.pop(gone).close()
    for name in names[:MAX_SERVICES]:
        if name in services or closed():
            continue
        src = TargetSource(target(name), board, timeout, source=source, fmt=fmt, writable=True)
        services[name] = src
        try:
            await src.start()
        except Exception as e:  # noqa: BLE001 (shown on the page)
            src.service.error = str(e) or type(e).__name__
            board.touch()
