"""How the ``serve`` steps run on each kind of server, and the user's part of a graceful stop.

- The two flavours (``lifecycle.py`` writes its start-up and stop sequences once, as steps): ``Threads`` for a
  ``grpc.server`` (every operation blocks and returns its result) and ``Aio`` for a ``grpc.aio.server``
  (every operation returns an awaitable), with the same methods.
- ``on_shutdown`` hooks: checked by ``check_shutdown_args``; run one by one by the stop sequence, each
  one's exception logged (the next still runs).
- The hard deadline (``hard_deadline=``): ``HardDeadline`` starts with the stop; when the stop has not
  finished after that many seconds (a hook or a call that hangs), it logs an ERROR and ends the process
  with status ``HARD_DEADLINE_EXIT_CODE`` (70, ``EX_SOFTWARE``) from a timer thread of its own, so that a
  blocked event loop or a hung thread cannot hold it up.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import grpc

from ..errors import describe_value
from ..registration.contract import Registration
from ..registration.outage import exit_process, positive_seconds

log = logging.getLogger("waypost.server")

#: the exit status after ``hard_deadline`` (``EX_SOFTWARE``: the stop did not finish in time)
HARD_DEADLINE_EXIT_CODE = 70

ShutdownHook = Callable[[], object]


class Forceable(Protocol):
    """A serve handle, as a stop waiting for its server sees it: did a second signal ask to cancel what still runs?"""

    def take_force(self) -> bool: ...


def check_shutdown_args(on_shutdown: Iterable[ShutdownHook] | None, hard_deadline: float | None, *,
                        allow_async: bool) -> tuple[ShutdownHook, ...]:
    """The hooks as a tuple; TypeError or ValueError naming what is wrong (``allow_async``: ``serve_async`` takes
    coroutine functions too)."""
    if hard_deadline is not None and not positive_seconds(hard_deadline):
        raise ValueError(f"serve: hard_deadline must be a positive number of seconds after the stop began (or None), "
                         f"got {describe_value(hard_deadline)}")
    if on_shutdown is None:
        return ()
    if callable(on_shutdown) or isinstance(on_shutdown, (str, bytes)) or not isinstance(on_shutdown, Iterable):
        raise TypeError(f"serve: on_shutdown takes a list of callables, got {describe_value(on_shutdown)}"
                         f"{': pass [f]' if callable(on_shutdown) else ''}")
    hooks = tuple(on_shutdown)
    for i, hook in enumerate(hooks):
        if not callable(hook):
            raise TypeError(f"serve: on_shutdown[{i}] must be a callable taking no argument, got {describe_value(hook)}")
        if not allow_async and inspect.iscoroutinefunction(hook):
            raise ValueError(f"serve: on_shutdown[{i}] ({hook_name(hook)}) is a coroutine function: serve() runs "
                             "hooks in a thread; use serve_async, or pass a plain function")
    return hooks


def hook_name(hook: ShutdownHook) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


class HardDeadline:
    """Ends the process (ERROR, then status 70) unless ``cancel()`` comes within ``seconds``."""

    def __init__(self, what: object, seconds: float) -> None:
        self._what, self._seconds = what, seconds
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.name = "waypost-hard-deadline"
        self._timer.start()

    def _fire(self) -> None:
        log.error("%r: the stop has not finished %gs after it began (hard_deadline; on_shutdown hooks or calls "
                  "still running): exiting with status %d", self._what, self._seconds, HARD_DEADLINE_EXIT_CODE)
        exit_process(HARD_DEADLINE_EXIT_CODE)

    def cancel(self) -> None:
        self._timer.cancel()


class Threads:
    """``grpc.server``: every operation blocks and returns its result."""

    def new_health_servicer(self) -> Any:
        from grpc_health.v1 import health

        return health.HealthServicer(experimental_non_blocking=True)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start_publisher(self, publisher: Registration) -> None:
        publisher.start()

    def stop_publisher(self, publisher: Registration) -> None:
        publisher.stop()

    def pause_publisher(self, publisher: Registration) -> None:
        publisher.pause()

    def resume_publisher(self, publisher: Registration) -> None:
        publisher.resume()

    def update_metadata(self, publisher: Registration, metadata: Mapping[str, object] | None) -> None:
        publisher.update_metadata(metadata)

    def run_hook(self, hook: ShutdownHook) -> None:
        result = hook()
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("it returned an awaitable, which serve() cannot await: use serve_async")

    def begin_stop(self, server: grpc.Server, grace: float) -> tuple[threading.Event]:
        """Refuse new calls; in-flight ones get ``grace`` seconds. A 1-tuple for ``wait_stopped``."""
        return (server.stop(grace),)

    def wait_stopped(self, server: grpc.Server, begun: tuple[threading.Event], handle: Forceable | None = None,
                     limit: float | None = None) -> None:
        """Return once the stop ``begun`` has finished (or after ``limit`` seconds); ``handle``: whose second
        signal (``handle.take_force()``) cancels what still runs, at once."""
        done = begun[0]
        deadline = None if limit is None else time.monotonic() + limit
        while not done.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                return
            if handle is not None and handle.take_force():
                server.stop(0)

    def stop_server(self, server: grpc.Server, grace: float, handle: Forceable | None = None,
                    limit: float | None = None) -> None:
        self.wait_stopped(server, self.begin_stop(server, grace), handle, limit)


class Aio:
    """``grpc.aio.server``: every operation returns an awaitable."""

    def new_health_servicer(self) -> Any:
        from grpc_health.v1.health import aio as health_aio

        return health_aio.HealthServicer()

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    def start_publisher(self, publisher: Registration) -> Awaitable[Registration]:
        return publisher.astart()

    def stop_publisher(self, publisher: Registration) -> Awaitable[None]:
        return publisher.astop()

    def pause_publisher(self, publisher: Registration) -> Awaitable[None]:
        return publisher.apause()

    def resume_publisher(self, publisher: Registration) -> Awaitable[None]:
        return publisher.aresume()

    def update_metadata(self, publisher: Registration, metadata: Mapping[str, object] | None) -> Awaitable[None]:
        return publisher.aupdate_metadata(metadata)

    def run_hook(self, hook: ShutdownHook) -> object:
        return hook()  # a coroutine function's result is awaited by the driver

    def begin_stop(self, server: grpc.aio.Server, grace: float) -> tuple[asyncio.Future[None]]:
        return (asyncio.ensure_future(server.stop(grace)),)  # (a tuple: the driver must not await it yet)

    def wait_stopped(self, server: grpc.aio.Server, begun: tuple[asyncio.Future[None]], handle: Forceable | None = None,
                     limit: float | None = None) -> asyncio.Future[None]:
        return begun[0]  # a second signal stops it at once from AsyncServeHandle._force_now

    def stop_server(self, server: grpc.aio.Server, grace: float, handle: Forceable | None = None,
                    limit: float | None = None) -> Awaitable[None]:
        return server.stop(grace)
