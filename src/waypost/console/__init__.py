"""``waypost console``: a live web page of every service, instance and registry, with drain and weight controls
(docs/console.md). Needs the ``console`` extra (aiohttp, prometheus-client)."""

from __future__ import annotations

from .actions import ActionError, make_action
from .server import DEFAULT_LISTEN, Console, ConsoleConfig

__all__ = ["DEFAULT_LISTEN", "ActionError", "Console", "ConsoleConfig", "make_action"]
