"""A publisher that stays unregistered: how long, the alert after ``max_unregistered``, and what to do then.

A publisher is *unregistered against its will* from the moment it finds its lease lost (not renewed
within its TTL, or gone from etcd) or a ``resume()`` fails, until a registration succeeds again. It
keeps retrying all along (forever); this module only measures and reacts:

- ``seconds()``: the length of the current outage (0 while registered, and while paused or stopped on
  purpose), exported as ``waypost_publisher_unregistered_seconds{key}`` next to
  ``waypost_publisher_registered{key}`` (the gauges read every live publisher at scrape time through the
  source registered here with ``waypost.metrics``);
- after ``max_unregistered`` seconds of one outage: an ERROR log (once per outage) and
  ``on_unregistered``, either a callable ``f(publisher)`` run in a thread of its own (it may block and
  call the sync API) or ``"exit"``: stop the publisher and end the process with ``UNREGISTERED_EXIT_CODE``
  (``serve()`` replaces the publisher's ``"exit"`` with its own graceful server stop first).

A server that cannot renew its lease for long is invisible to every client while it looks healthy to
itself; exiting lets a supervisor (systemd, Kubernetes) restart it or move it elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .. import metrics

log = logging.getLogger("waypost.discovery")

#: the exit status of a process that ends because its registration stayed lost (sysexits' EX_TEMPFAIL:
#: a temporary failure, worth a restart)
UNREGISTERED_EXIT_CODE = 75

OnUnregistered = Callable[[Any], object] | Literal["exit"] | None


def check_unregistered_args(max_unregistered: float | None, on_unregistered: OnUnregistered) -> float | None:
    """Validate the pair; returns ``max_unregistered`` as a float (None: no alert)."""
    if max_unregistered is not None and not positive_seconds(max_unregistered):
        raise ValueError(f"max_unregistered must be a positive number of seconds (or None), got {max_unregistered!r}")
    if on_unregistered is not None and on_unregistered != "exit" and not callable(on_unregistered):
        raise ValueError(f"on_unregistered must be a callable f(publisher) or 'exit', got {on_unregistered!r}")
    if on_unregistered is not None and max_unregistered is None:
        raise ValueError("on_unregistered needs max_unregistered: after how many seconds unregistered to act")
    return None if max_unregistered is None else float(max_unregistered)


def positive_seconds(value: object) -> bool:
    """True when ``value`` is a finite number of seconds above 0 (not a bool): what a duration option accepts."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


class Outage:
    """The outage clock of one publisher. ``begin``/``end`` run on the control loop."""

    def __init__(self, owner: Any, max_unregistered: float | None, on_unregistered: OnUnregistered,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.owner = owner
        self.max_unregistered = check_unregistered_args(max_unregistered, on_unregistered)
        #: what to do after ``max_unregistered``: a callable f(publisher), "exit" or None (log only)
        self.on_unregistered = on_unregistered
        #: how "exit" exits: by default stop the publisher and end the process; ``serve()`` sets its own
        #: (a graceful server stop first), run like the default in a non-daemon thread
        self.exit_action: Callable[[], None] = self._exit
        self.clock = clock
        self.since: float | None = None
        self.alerts = 0  # outages that lasted max_unregistered (for tests and introspection)
        self._timer: asyncio.TimerHandle | None = None

    def seconds(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        since = self.since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def begin(self) -> None:
        """The registration was lost against the owner's will (idempotent during one outage)."""
        if self.since is not None:
            return
        self.since = self.clock()
        if self.max_unregistered is not None:
            self._timer = asyncio.get_running_loop().call_later(self.max_unregistered, self._expired)

    def end(self) -> float:
        """Registered again, or paused/stopped on purpose: the outage (if any) is over; returns its length."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lasted = self.seconds()
        self.since = None
        return lasted

    def _expired(self) -> None:
        self._timer = None
        if self.since is None:
            return
        self.alerts += 1
        action = self.on_unregistered
        what = (f"stopping and exiting with status {UNREGISTERED_EXIT_CODE}" if action == "exit"
                else "calling on_unregistered" if action is not None else "still retrying")
        log.error("%r: unregistered for %.1fs (max_unregistered=%gs), clients cannot find it; %s",
                  self.owner, self.seconds(), self.max_unregistered, what)
        if action is None:
            return
        if action == "exit":
            threading.Thread(target=self.exit_action, name="waypost-unregistered-exit", daemon=False).start()
        else:
            threading.Thread(target=self._call, args=(action,), name="waypost-on-unregistered",
                             daemon=True).start()

    def _call(self, action: Callable[[Any], object]) -> None:
        try:
            action(self.owner)
        except Exception:
            log.exception("%r: on_unregistered raised", self.owner)

    def _exit(self) -> None:
        try:
            self.owner.stop()
        except Exception as e:  # noqa: BLE001 -- exiting anyway: the registration is lost already
            log.warning("%r: stopping before exit failed: %s", self.owner, e)
        exit_process(UNREGISTERED_EXIT_CODE)


def exit_process(status: int) -> None:
    """End the process now with ``status`` from any thread, after flushing the logs and standard streams
    (``sys.exit`` would only end the calling thread)."""
    for logger in (logging.getLogger(), logging.getLogger("waypost")):
        for handler in logger.handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001, S110 -- nothing to report to any more
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(status)


# ---- the gauges' source: every live publisher of this process ------------------------------------------

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_live_lock = threading.Lock()


def track(publisher: Any) -> None:
    """Report ``publisher`` in the gauges (from its start until its stop)."""
    with _live_lock:
        _live.add(publisher)


def untrack(publisher: Any) -> None:
    with _live_lock:
        _live.discard(publisher)


def _samples() -> Iterator[metrics.PublisherSample]:
    with _live_lock:
        publishers = list(_live)
    for p in publishers:
        yield metrics.PublisherSample(p.base_key, p.registered, p.unregistered_seconds, registry_label(p))


def registry_label(publisher: Any) -> str:
    """The registry a publisher writes to, without secrets (``registry_url`` or its Registry's ``url``)."""
    label = getattr(publisher, "registry_url", None) or getattr(getattr(publisher, "registry", None), "url", "")
    return str(label)


metrics.register_publisher_source(_samples)
