"""``waypost console``: a live web page of every service, instance and registry, with drain and weight controls
(docs/console.md). The page needs the ``console`` extra (aiohttp, prometheus-client); the operator actions
(``waypost drain|undrain|weight``, ``console.actions``) do not, so the web server is imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .actions import ActionError, make_action

if TYPE_CHECKING:
    from .server import DEFAULT_LISTEN, Console, ConsoleConfig

__all__ = ["DEFAULT_LISTEN", "ActionError", "Console", "ConsoleConfig", "make_action"]

_SERVER_NAMES = frozenset({"DEFAULT_LISTEN", "Console", "ConsoleConfig"})


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
