"""The control-plane event loop: one background asyncio loop thread per process.

Long-lived streams and timers (etcd keepalive, watches, resolvers) all run here, so the process
never needs a thread per stream or per backend. The data plane never waits on this loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None


def _run(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()


def get_loop() -> asyncio.AbstractEventLoop:
    """Return the control-plane loop, starting its thread on first use (and again after fork)."""
    global _loop, _thread, _pid
    loop = _loop
    if loop is not None and _pid == os.getpid() and loop.is_running():
        return loop
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()
            thread = threading.Thread(target=_run, args=(loop, started), name="waypost-control", daemon=True)
            thread.start()
            started.wait()
            _loop, _thread, _pid = loop, thread, os.getpid()
        return _loop


def current_loop() -> asyncio.AbstractEventLoop | None:
    """The control loop if this process started it (None before that, and in a forked child: the loop thread
    stayed in the parent)."""
    return _loop if _pid == os.getpid() else None


def in_loop() -> bool:
    """True when called from the control-plane loop thread."""
    return _thread is not None and threading.current_thread() is _thread and _pid == os.getpid()


def submit(coro: Awaitable[T]) -> concurrent.futures.Future[T]:
    """Schedule a coroutine on the control loop; returns a concurrent future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())  # type: ignore[arg-type]


def run(coro: Awaitable[T], timeout: float | None = None) -> T:
    """Run a coroutine on the control loop and wait for its result (never call from the loop itself)."""
    if in_loop():
        raise RuntimeError("waypost._loop.run() called from the control loop; await the coroutine instead")
    fut = submit(coro)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise


def call_soon(fn: Callable[..., Any], *args: Any) -> None:
    """Call fn(*args) on the control loop, thread-safely."""
    get_loop().call_soon_threadsafe(fn, *args)


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a finished future's outcome as seen, so that dropping it logs no "exception was never
    retrieved"; a future still running is marked when it ends."""
    if not fut.done():
        fut.add_done_callback(retrieve)
    elif not fut.cancelled():
        fut.exception()


def abandon(fut: asyncio.Future[Any]) -> None:
    """Cancel a future nobody will await any more; its outcome (an error raised while it was being
    cancelled, say) is retrieved when it ends."""
    fut.cancel()
    retrieve(fut)


async def gather_within(timeout: float, *aws: Awaitable[T]) -> list[T]:
    """``asyncio.wait_for(asyncio.gather(*aws), timeout)`` whose gather never ends unretrieved.

    When the caller is cancelled while waiting, ``wait_for`` cancels the gather and waits for it but
    never looks at its outcome; on Python 3.11 a cancelled gather then holds a ``CancelledError`` as
    its exception, and the collector logs "_GatheringFuture exception was never retrieved" with a
    traceback, from the loop thread, whenever it finds the future (at a subscriber's close, at exit).
    """
    fut = asyncio.gather(*aws)
    try:
        return await asyncio.wait_for(fut, timeout)
    finally:
        retrieve(fut)
