"""Bounded waits for tests: the one polling loop.

``wait_until`` is for preconditions and promises: it returns the first truthy value of ``cond`` or fails
the test with an ``AssertionError`` saying what was awaited, for how long, and the last value seen.
``holds_within`` is for measurements (the chaos scenarios record "recovered within N s" as a figure
instead of failing at once); it answers True or False through the same loop.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

__all__ = ["holds_within", "wait_until"]

DEFAULT_TIMEOUT = 20.0  # generous: a loaded 2-core CI machine
DEFAULT_INTERVAL = 0.02


def wait_until(cond: Callable[[], Any], timeout: float = DEFAULT_TIMEOUT, what: str | None = None, *,
               interval: float = DEFAULT_INTERVAL) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; after ``timeout`` seconds raise
    ``AssertionError`` naming ``what`` (default: the source text of ``cond``) and the last value."""
    ok, last = _poll(cond, timeout, interval)
    if not ok:
        raise AssertionError(f"not within {timeout:g} s: {what or describe(cond)} (last value: {_short(last)})")
    return last


def holds_within(cond: Callable[[], Any], timeout: float, *, interval: float = DEFAULT_INTERVAL) -> bool:
    """Whether ``cond`` became truthy within ``timeout`` seconds (a measurement; never raises)."""
    return _poll(cond, timeout, interval)[0]


def _poll(cond: Callable[[], Any], timeout: float, interval: float) -> tuple[bool, Any]:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return True, value
        if time.monotonic() >= deadline:
            return False, value
        time.sleep(interval)


def describe(cond: Callable[[], Any]) -> str:
    """The source text of a lambda (its ``lambda ...`` part), else the function's name."""
    name = getattr(cond, "__qualname__", repr(cond))
    if getattr(cond, "__name__", "") != "<lambda>":
        return name
    try:
        src = inspect.getsource(cond)
    except (OSError, TypeError):  # no source file (e.g. defined in an exec'd string)
        return name
    text = " ".join(src[src.find("lambda"):].split())
    return _short(text, 200)


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
