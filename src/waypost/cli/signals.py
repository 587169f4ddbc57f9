"""How the long-running commands (``etcd``, ``watch``, ``console``, ``xds serve``, ...) stop: SIGTERM or SIGINT sets
an event for the duration of the command, and Ctrl-C exits with 130 after the clean-up, as a shell expects."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from types import FrameType


class Stop(threading.Event):
    """Set by SIGTERM or SIGINT (``signum`` says which), or by the command itself (a ``--for`` timer)."""

    signum: int | None = None


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """An event set by SIGTERM/SIGINT for the duration of the block (signal handlers exist on the main thread only:
    elsewhere the event is only set by the caller); the previous handlers are put back after it."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.signum = signum
        stop.set()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def exit_if_interrupted(stop: Stop) -> None:
    """After a command cleaned up: Ctrl-C (SIGINT) exits with 130, as a shell expects; SIGTERM with 0."""
    if stop.signum == signal.SIGINT:
        raise click.exceptions.Exit(130)
