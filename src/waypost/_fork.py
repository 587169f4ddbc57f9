"""fork() safety for the control plane: no grpc.aio object may be alive when the process forks.

Why: grpc.aio keeps one native poller thread blocked inside gRPC core for as long as any grpc.aio channel
exists (the etcd client's channels, health-check channels). gRPC core runs its own fork handlers only when
no thread is inside it ("Other threads are currently calling into gRPC, skipping fork() handlers"); skipped,
the child inherits a core whose polling state names a thread that does not exist there: it crashes
(SIGSEGV, SIGABRT ``next_worker->state == KICKED``) or its grpc.aio calls never complete. Once the last
grpc.aio channel is gone the poller thread ends, core's fork handlers run, and the child can use gRPC
(sync and aio) from scratch.

So, before every fork (``os.register_at_fork``), in the forking process:

1. every registered participant (``register``) closes its grpc.aio channels on the control loop and drops
   them, so the poller thread ends (we wait for it, bounded);
2. the control loop is parked (blocked in a callback) so nothing creates a channel until the fork is done.

After the fork, the parent releases the loop and every participant reconnects (streams resume as after a
network blip). The child starts its own control loop on first use and abandons every inherited participant
(``abandon_after_fork``: no grpc call), so objects made before the fork fail clearly instead of hanging.

A process that never started the control loop pays nothing: the hook returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from . import _loop

log = logging.getLogger("waypost.fork")

#: Bound on each wait of the before-fork hook (suspend, poller exit, parking): a fork is never blocked longer.
WAIT_S = 5.0
#: Our own channels are gone within milliseconds of being closed; a poller alive longer is held by someone
#: else's grpc.aio object (the child is then refused: check_child_can_use_grpc).
POLLER_WAIT_S = 1.0


class Participant(Protocol):
    """An object that owns grpc.aio channels on the control loop."""

    async def suspend_for_fork(self) -> None:
        """Close and drop every grpc.aio channel (on the control loop, in the parent, before fork)."""

    def resume_after_fork(self) -> None:
        """Create the channels again (on the control loop, in the parent, after fork)."""

    def abandon_after_fork(self) -> None:
        """In the child: never touch the inherited channels again; later use fails with a clear error."""


_participants: weakref.WeakSet[Participant] = weakref.WeakSet()
_plock = threading.Lock()
#: In a child where gRPC cannot work, why (the message of check_child_can_use_grpc); None elsewhere.
_unsafe_child: str | None = None
_ALIVE_AT_FORK = (
    "this process was forked while grpc.aio objects (e.g. a waypost.aio channel) were alive in its parent, so "
    "gRPC cannot work here. Close every grpc.aio channel before forking, or create them only in the workers, "
    "after the fork (gunicorn: post_fork hook or lazily on first use)."
)
_CORE_FORK_DISABLED = (
    "this process is a forked child and GRPC_ENABLE_FORK_SUPPORT is off, so gRPC core did not prepare for the "
    "fork and no channel can connect here. Leave GRPC_ENABLE_FORK_SUPPORT unset (or set it to 1)."
)
_release: threading.Event | None = None
_suspended: list[Participant] = []
#: whether grpc.aio's poller thread was still alive at the last fork (after the participants were suspended)
_alive_at_fork = False
#: True from the start of the before-fork hook until the parent resumed
_forking = False


def register(p: Participant) -> None:
    """Take part in the fork protocol (weakly referenced: no need to unregister)."""
    with _plock:
        _participants.add(p)


class PausableTask:
    """A control-loop task that holds grpc.aio channels (e.g. a health watch): stopped before a fork (its
    ``finally`` closes its channels), started again in the parent after it, dropped in the child.

    ``make()`` returns a fresh coroutine for each start. ``cancel()`` (any thread) ends it for good.
    """

    def __init__(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._make = make
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False
        register(self)

    def start(self) -> PausableTask:
        _loop.call_soon(self._start)
        return self

    def _start(self) -> None:
        # during a fork nothing may open a channel: resume_after_fork starts it right after
        if not self._cancelled and self._task is None and not _forking:
            self._task = asyncio.get_running_loop().create_task(self._make())

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        _loop.call_soon(self._stop)

    def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def suspend_for_fork(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def resume_after_fork(self) -> None:
        self._start()

    def abandon_after_fork(self) -> None:
        self._cancelled = True
        self._task = None


def aio_poller_alive() -> bool:
    """True while grpc.aio's poller thread runs, i.e. while some grpc.aio channel or server exists.

    grpcio starts it as an unnamed ``threading.Thread`` whose target is ``PollerCompletionQueue._poll_wrapper``,
    so Python names it ``Thread-N (_poll_wrapper)``; it ends when the last grpc.aio channel is deallocated."""
    return any("_poll_wrapper" in t.name for t in threading.enumerate())


def check_child_can_use_grpc(what: str) -> None:
    """Raise a clear error in a child where gRPC would hang or crash (see the module docstring)."""
    if _unsafe_child is not None:
        raise RuntimeError(f"{what}: {_unsafe_child}")


async def _suspend_all(parts: list[Participant]) -> None:
    for p in parts:
        try:
            await p.suspend_for_fork()
        except Exception:
            log.exception("waypost: suspending %r before fork failed", p)


def _park(parked: threading.Event, release: threading.Event, parts: list[Participant]) -> None:
    # Runs on the control loop: blocks it until the fork is over, then reconnects in the parent.
    parked.set()
    release.wait(WAIT_S * 4)
    with _plock:  # also those registered during the fork (their start was deferred)
        parts = list(dict.fromkeys([*parts, *_participants]))
    for p in parts:
        try:
            p.resume_after_fork()
        except Exception:
            log.exception("waypost: resuming %r after fork failed", p)


def _before() -> None:
    global _release, _forking
    _suspended.clear()
    _release = None
    loop = _loop.current_loop()
    if loop is None or not loop.is_running() or _loop.in_loop():
        return  # no control loop in this process (or forking from it: nothing we can wait for)
    _forking = True
    t0 = time.monotonic()
    with _plock:
        parts = list(_participants)
    try:
        _loop.run(_suspend_all(parts), WAIT_S)
        with _plock:  # registered meanwhile (e.g. a health watch of a backend that just appeared)
            late = [p for p in _participants if p not in parts]
        if late:
            _loop.run(_suspend_all(late), WAIT_S)
            parts += late
    except TimeoutError:
        log.warning("waypost: the control loop did not stop its etcd streams within %gs before fork", WAIT_S)
    # The calls cut by close() end on the loop over a few turns; their tracebacks form reference cycles that
    # hold the channels: collect until the poller thread is gone.
    # Young generations first: they are cheap and usually hold those cycles.
    deadline = time.monotonic() + POLLER_WAIT_S
    generation = 0
    while True:
        gc.collect(generation)
        if not aio_poller_alive() or time.monotonic() >= deadline:
            break
        if generation < 2:
            generation += 1
        else:
            time.sleep(0.01)
    parked, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(_park, parked, release, parts)
    if not parked.wait(WAIT_S):
        log.warning("waypost: the control loop could not be paused before fork")
    _release = release
    _suspended.extend(parts)
    log.debug("waypost: control plane quiesced for fork in %.1f ms", (time.monotonic() - t0) * 1e3)


def _after_in_parent() -> None:
    global _forking
    _forking = False
    release = _release
    if release is not None:
        release.set()
    _suspended.clear()


_NO_HEALTH_AFTER_FORK = (
    "waypost: %s: health checking is off in this process: it was forked from a process that used gRPC, and "
    "health watches there (on grpc.aio or on sync gRPC threads alike) made calls hang until their deadline in "
    "about one forked child in five. Calls still avoid backends that are not connected, and the policy steers away "
    "from backends that fail (outlier_detection ejects them when configured). For health checks in workers, "
    "fork before using gRPC (gunicorn: no --preload, or dial only in post_fork)")


def health_checks_allowed(service: str | None, target: str) -> str | None:
    """The health service a new channel may watch here: ``service``, or None (with a warning) in a process
    forked from one that used gRPC (see _NO_HEALTH_AFTER_FORK)."""
    if service is not None and _forked_from_grpc:
        log.warning(_NO_HEALTH_AFTER_FORK, target)
        return None
    return service


_forked_from_grpc = False


def _after_in_child() -> None:
    # _release is set when _before quiesced a running control loop, i.e. the parent was using gRPC
    global _unsafe_child, _release, _participants, _plock, _forking, _forked_from_grpc
    _forking = False
    _forked_from_grpc = _forked_from_grpc or _release is not None
    if _alive_at_fork:
        _unsafe_child = _ALIVE_AT_FORK
    elif _release is not None and _core_fork_disabled():  # gRPC was in use in the parent (its loop ran)
        _unsafe_child = _CORE_FORK_DISABLED
    else:
        _unsafe_child = None
    inherited = list(_participants) + list(_suspended)
    _participants = weakref.WeakSet()
    _plock = threading.Lock()
    _release = None
    _suspended.clear()
    for p in set(inherited):
        try:
            p.abandon_after_fork()
        except Exception:  # pragma: no cover - abandoning only flips flags
            log.exception("waypost: abandoning %r after fork failed", p)


def _core_fork_disabled() -> bool:
    # gRPC core reads this variable too; explicitly off, it skips its fork handlers (measured: a child then
    # gets no READY connection, old or new)
    return os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").strip().lower() in ("0", "false", "no", "off")


def _record_poller_state() -> None:
    global _alive_at_fork
    _alive_at_fork = aio_poller_alive()
    if _alive_at_fork:
        log.warning(
            "waypost: forking while grpc.aio objects are alive (a grpc.aio / waypost.aio channel or server): "
            "gRPC will not work in the child. Close them before forking, or create them after the fork."
        )


if hasattr(os, "register_at_fork"):
    # before-hooks run in reverse order of registration: _before quiesces first, then the state is recorded
    os.register_at_fork(before=_record_poller_state)
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
