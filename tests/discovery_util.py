"""Helpers shared by the registry contract and discovery tests (no fixtures here: see conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from etcd_helpers import run, wait_until

from waypost import _loop
from waypost.registry.base import Event, Registry, Watch

__all__ = ["connect", "next_batches", "run", "wait_for"]


def connect(url: str) -> Registry:
    """``waypost.connect``: the process-wide shared registry for ``url``."""
    from waypost.registry import connect as _connect

    return _connect(url)


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``cond`` until it is truthy or ``timeout`` seconds pass; returns the last result's truth."""
    return wait_until(cond, timeout, interval)


def next_batches(watch: Watch, n: int, timeout: float = 10.0) -> list[list[Event]]:
    """Read ``n`` event batches from a watch (on the control loop), failing after ``timeout``."""

    async def read() -> list[list[Event]]:
        out = []
        for _ in range(n):
            out.append(await asyncio.wait_for(watch.__anext__(), timeout))
        return out

    return _loop.run(read(), timeout + 5)
