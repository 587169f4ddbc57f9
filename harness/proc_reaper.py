"""One reaper for the server processes the tests start: what is still running when the test process ends is
stopped, whether it ends normally or by SIGTERM / SIGHUP.

* ``track(owner, stop)``: ``stop()`` runs at exit unless ``untrack(owner)`` came first (owners are stopped
  newest first, each once). ``stop`` must be bounded, e.g. ``stop_process``.
* ``stop_process(proc, timeout, kill=False)``: SIGTERM (SIGKILL with ``kill``) by PID, SIGKILL after ``timeout``
  s, then reaped. A stop in progress when the test process ends is carried to its end (within its bound).
* ``wait_group(proc, limit)``: wait for a process that leads a process group of its own (``start_new_session``),
  e.g. a build; past ``limit`` s the whole group is SIGKILLed and ``subprocess.TimeoutExpired`` raised. It is
  tracked while waited for, so a test run ended meanwhile does not leave the build running.

Signals: the servers run in sessions of their own (a terminal's signals do not reach them) and Python ends on
SIGTERM or SIGHUP without running atexit hooks, so the first ``track`` made in the main thread installs a handler
for each of them that has none: it stops every tracked owner, then ends the process by the same signal as the
default action would have. A process forked from this one stops nothing of its parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

#: the signals whose default action would end the test process without atexit hooks
SIGNALS = (signal.SIGTERM, signal.SIGHUP)

# id(owner) -> (owner, stop); the owner is held so that its id is not reused while it is tracked
_owners: dict[int, tuple[object, Callable[[], object]]] = {}
# id(proc) -> (proc, timeout): stop_process calls in progress. An owner's stop clears the process from the owner
# before it waits, so a signal arriving during that wait would find nothing left to stop through the owner.
_stopping: dict[int, tuple[subprocess.Popen[Any], float]] = {}
# forked children inherit the table and the handlers: only the process that imported this module reaps
_pid = os.getpid()
_handlers_installed = False


def track(owner: object, stop: Callable[[], object]) -> None:
    """Call ``stop()`` when this process ends, unless ``untrack(owner)`` comes first. Tracking an owner again
    replaces its ``stop``."""
    _owners[id(owner)] = (owner, stop)
    _install_handlers()


def untrack(owner: object) -> None:
    """Forget ``owner`` (it stopped its processes itself); unknown owners are fine."""
    _owners.pop(id(owner), None)


def reap() -> None:
    """Stop every tracked owner, newest first (an owner whose stop fails does not keep the others running), then
    carry any ``stop_process`` that this one interrupted to its end."""
    if os.getpid() != _pid:
        return
    while _owners:
        _, stop = _owners.pop(next(reversed(_owners)))
        with contextlib.suppress(Exception):
            stop()
    for proc, timeout in list(_stopping.values()):
        with contextlib.suppress(Exception):
            _finish_stop(proc, timeout)


def _finish_stop(proc: subprocess.Popen[Any], timeout: float) -> None:
    """Wait up to ``timeout`` s for a process already told to stop, then SIGKILL it and reap it (10 s at most).
    Runs while the interrupted stop_process waits (a signal handler in the same thread), so it waits with waitpid
    itself: ``proc``'s own wait would be left holding its lock."""
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        try:
            if os.waitpid(proc.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped already
            return
        if time.monotonic() >= deadline:
            if killed:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)  # not reaped yet, so the PID is still this process's
            killed, deadline = True, time.monotonic() + 10
        time.sleep(0.05)


atexit.register(reap)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    reap()
    # the default action, as if no handler had been installed: the run ends by this signal
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; a later track from it will
    for signum in SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:  # a handler set by someone else stays theirs
            signal.signal(signum, _on_signal)
    _handlers_installed = True


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 10.0, *, kill: bool = False) -> None:
    """End ``proc`` by its PID: SIGTERM (SIGKILL with ``kill``: a crash), SIGKILL when it is still running after
    ``timeout`` s. A process that already exited is left as it is."""
    if proc is None or proc.poll() is not None:
        return
    _stopping[id(proc)] = (proc, timeout)
    try:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    finally:
        _stopping.pop(id(proc), None)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group that ``proc`` leads (it was started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_group(proc: subprocess.Popen[Any], limit: float) -> int:
    """``proc``'s exit code; past ``limit`` s its whole process group is killed and ``subprocess.TimeoutExpired``
    raised (the group is killed too when the wait is interrupted). ``proc`` leads a process group of its own
    (``start_new_session``)."""
    track(proc, lambda: kill_group(proc))
    try:
        return proc.wait(limit)
    except BaseException:
        # past the limit, and also when the wait itself is interrupted (pytest-timeout ending the test that
        # started a build, ^C): the group goes too, or it would go on building into a work directory the next
        # builder empties, beside it, on the same two cores
        kill_group(proc)  # the children too (go compile, link; mvn's JVM)
        proc.wait(30)
        raise
    finally:
        untrack(proc)


__all__ = ["kill_group", "reap", "stop_process", "track", "untrack", "wait_group"]
