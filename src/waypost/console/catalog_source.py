"""What every catalog registry on the console shares (a registry of instances read by service name, not a
keyspace: each kind's ``console_source`` in the table of kinds).

A catalog source lists the registry's services, follows each through waypost's own resolver (a
``TargetSource`` of its dial target: what a client dialing it sees, ``follow_services``), and shows the
registry's overrides on the board. ``CatalogSource`` holds that common part: the followed services, the
source's tasks and its registry client (made on first use, on the control loop), the board's view of the
source (up, down, its overrides) and ``close``. A kind gives ``kind`` (what the page calls it), its client's
maker, ``_target`` (the dial target of one service) and ``start``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar

from .board import Board
from .sources import TargetSource, follow_services, on_control


class CatalogSource(abc.ABC):
    """One catalog registry on the board, shown as ``name`` (its URL, no secrets), read through the client
    ``new_client()`` makes; see the module docstring."""

    kind: ClassVar[str]

    def __init__(self, name: str, board: Board, timeout: float, new_client: Callable[[], Any]) -> None:
        self.name = name
        self.board = board
        self.timeout = timeout
        self._services: dict[str, TargetSource] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._new_client = new_client
        self._client: Any = None
        self._closed = False

    @property
    def url(self) -> str:
        return self.name

    # -- what a kind gives ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """The first read, then following the registry until ``close`` (``_spawn``)."""

    @abc.abstractmethod
    def _target(self, service: str) -> str:
        """The dial target of ``service`` in this registry."""

    # -- shared ----------------------------------------------------------------------------------------

    def client(self) -> Any:
        """The registry's client (made, and used only, on the control loop)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coro`` until ``close`` (``what``: the task's name after ``waypost-console-``)."""
        self._tasks.append(asyncio.create_task(coro, name=f"waypost-console-{what}"))

    def _down(self, e: BaseException) -> None:
        """The registry could not be read: shown on the page (the next read tries again)."""
        self.board.source_down(self.name, self.kind, str(e) or type(e).__name__)

    def _show_overrides(self, now: Mapping[tuple[str, str, str], dict[str, Any]]) -> None:
        """Make ``now`` the board's overrides of this source (the page is told only when they changed)."""
        old = {k: v for k, v in self.board.overrides.items() if k[0] == self.name}
        if dict(now) != old:
            for k in old:
                self.board.overrides.pop(k, None)
            self.board.overrides.update(now)
            self.board.touch()

    async def _follow_names(self, names: Sequence[str]) -> None:
        """Follow the registry's services ``names`` now (the ones gone closed, the new ones started)."""
        await follow_services(self._services, names, self.board, target=self._target, source=self.name,
                              fmt=self.kind, timeout=self.timeout, closed=lambda: self._closed)

    async def _release(self) -> None:
        """Close the registry's client (on the control loop), if one was made."""
        client, self._client = self._client, None
        if client is not None:
            await on_control(client.close())

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for src in self._services.values():
            await src.close()
        self._services.clear()
        await self._release()
