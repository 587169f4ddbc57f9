"""The resolver of every kind written against ``waypost.kinds``: a kind's ``Discovery`` followed from one task on
the control loop.

- ``start(on_update, on_error)`` starts the task. With ``options.blocking`` (sync dial) it returns once the first
  list is known; it raises ``RegistryUnavailable`` when there is none within the dial's ``timeout`` (naming why:
  the last failure) or at once when a failure is one another read will not cure (``InvalidTarget``,
  ``PermissionDenied``). Without it (aio dial), it returns at once.
- The kind's ``Discovery`` is made with the resolver (and given the dial's channel options), so a target or an
  option the kind refuses fails the dial at once; it is closed with the resolver. The task runs the discovery's
  ``watch`` again and again and pushes every list it yields. When the watch raises, the failure is described,
  logged (a WARNING for a new reason, DEBUG when it repeats) and reported, and the next try waits ``backoff``
  (the channel keeps the last list meanwhile). ``LookupFailed`` is an answer (the name has no instances for
  now): the channel hears it at once and a blocking start returns, while the reads go on.
- ``options.report_early``: until the first list, failures reach ``on_error`` only with it (calls then fail at once
  naming the reason); without it they wait for the first list's deadline, when the reason is reported anyway.
  With it, a non-blocking start whose first read has not answered within ``DIAGNOSE_AFTER`` asks the discovery
  why (``Discovery.diagnose``) and reports that while the read goes on.
- A list goes to the channel (subset) when it changed, or after an error was shown (the update tells the channel
  the resolver works again). ``resolve_now`` reaches the discovery (a polling one reads again soon); ``close`` and
  ``aclose`` end the task, and return once the discovery is closed (bounded: what it held, e.g. a shared watch,
  is released when they return), except ``close`` called on the control loop itself, which never waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _loop
from ..backoff import RECONNECT, Backoff
from ..errors import InvalidTarget, PermissionDenied, RegistryUnavailable
from ..kind_table import RegistryKind, part
from ..resolver.base import OnError, OnUpdate, ResolverOptions, notify
from ..resolver.target import Target
from ..types import Backend
from . import Discovery, LookupFailed

__all__ = ["DIAGNOSE_AFTER", "START_GRACE", "KindResolver"]

#: how much longer than the first list's deadline a blocking start waits: the loop gives up at the deadline
#: itself, with the reason it knows; this only bounds a loop that cannot run at all
START_GRACE = 1.0
#: a non-blocking start that reports early and has no first list after this many seconds asks the discovery why
DIAGNOSE_AFTER = 0.3
#: how long ``close`` and ``aclose`` wait for the discovery's close
CLOSE_WAIT = 5.0


class KindResolver:
    """Follows ``target`` through ``kind``'s ``Discovery`` (see the module docstring). ``timeout`` bounds a blocking
    start (sync dial): the first list must come within it, else ``RegistryUnavailable`` names why. ``rng``
    (jitter) and ``clock`` are for tests."""

    def __init__(self, kind: RegistryKind, target: Target, options: ResolverOptions | None = None, *,
                 timeout: float = 5.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        service = target.key or (target.endpoints[0] if target.endpoints else "")
        if not service:
            raise InvalidTarget(f"{kind.title}: the target names no service: {target.redacted}")
        options = options if options is not None else ResolverOptions()
        self.registry_kind = kind
        self.target = target
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.report_early = options.report_early
        self.quiet = options.quiet
        self.log = logging.getLogger(f"waypost.resolver.{kind.scheme}")
        #: the service followed: the target's key (a target with none, e.g. DNS's: the name it resolves)
        self.service: str = service
        self.timeout = timeout
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._future: concurrent.futures.Future[None] | None = None
        # done once the first list is known, or given up (an error, raised by a blocking start)
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._closed = False
        # the loop's task began (there is something to wait for at close), and ended (the discovery is closed)
        self._began = threading.Event()
        self._ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._on_update: OnUpdate | None = None
        self._on_error: OnError | None = None
        self._last: tuple[Backend, ...] | None = None  # the last list the channel took
        self._last_error = ""
        self._error_shown = False  # the channel was told of an error since the last push
        self._failing = 0  # failed reads in a row (0: the last read worked)
        self._answered = False  # a LookupFailed came: failures are answers, never held back
        #: pushes to the channel so far (introspection and tests)
        self.pushes = 0
        #: clock time of the last change pushed to the channel
        self.last_push_at: float | None = None
        # made here, so that a target, an option or a client library the kind refuses fails the dial itself
        self._discovery: Discovery = part(kind, "discovery")(target)
        self._discovery.dial_timeout = timeout
        self._discovery.configure(dict(options.channel_options))
        # one read is bounded by the dial's timeout too: a lookup given 1 s answers (naming why) within it
        self._discovery.read_timeout = min(self._discovery.read_timeout, timeout)
        #: the pause after failures in a row
        self.backoff: Backoff = self._discovery.backoff if self._discovery.backoff is not None else RECONNECT

    @property
    def discovery(self) -> Discovery:
        """The kind's ``Discovery`` (introspection and tests)."""
        return self._discovery

    # ---- Resolver contract --------------------------------------------------------------------------

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        """Follow the source on the control loop. Blocking (sync dial): return once the first list is known;
        raise RegistryUnavailable (or the refusal) when there is none in time, naming why."""
        self._on_update, self._on_error = on_update, on_error
        self._future = _loop.submit(self._run())
        if not self.blocking:
            return
        try:
            self._first.result(self._first_list_within() + START_GRACE)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RegistryUnavailable(self._no_list_error()) from None
        except BaseException:
            self.close()
            raise

    def resolve_now(self, reason: str) -> None:
        self._discovery.resolve_now()

    def close(self) -> None:
        if not self._stop() or _loop.in_loop():
            return
        try:
            self._ended.result(CLOSE_WAIT)
        except concurrent.futures.TimeoutError:
            self.log.warning("waypost: %s: the discovery of %s did not close within %gs", self.registry_kind.scheme,
                             self._what(), CLOSE_WAIT)

    async def aclose(self) -> None:
        """close() without blocking an event loop."""
        if not self._stop():
            return
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._ended), CLOSE_WAIT)
        except asyncio.TimeoutError:
            self.log.warning("waypost: %s: the discovery of %s did not close within %gs", self.registry_kind.scheme,
                             self._what(), CLOSE_WAIT)

    def _stop(self) -> bool:
        """End the task; True when it began (its end is worth waiting for)."""
        self._closed = True
        if self._future is not None:
            self._future.cancel()
        return self._began.is_set() and not self._ended.done()

    # ---- the loop -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._began.set()
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = loop.call_later(self._first_list_within(), self._give_up_first)
        early = asyncio.ensure_future(self._diagnose_early()) if self.report_early and not self.blocking else None
        try:
            while not self._closed:
                try:
                    async for backends in self._discovery.watch(self.service):
                        if self._read_worked():
                            self.log.info("waypost: %s: reading %s works again", self.registry_kind.scheme,
                                          self._what())
                        self._push(tuple(backends))
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001  # keep the last list, retry with backoff
                    self._failing += 1
                    self._failed(e)
                    if loop.time() - started >= self.timeout:  # the dial's time is spent and why is known: no
                        self._give_up_first()  # grace past it (that is for a read still under way)
                    await asyncio.sleep(self.backoff.delay(self._failing, self._rng))
        finally:
            deadline.cancel()
            if early is not None:
                early.cancel()
            try:
                await self._discovery.close()
            finally:
                self._ended.set_result(None)

    async def _diagnose_early(self) -> None:
        """A first read slow to answer: the discovery's account of why goes to the channel (calls fail naming it)
        while the read goes on, unless a list or a failure came meanwhile."""
        await asyncio.sleep(DIAGNOSE_AFTER)
        if self._first.done() or self._last_error:
            return
        try:
            why = await self._discovery.diagnose(self.service)
        except Exception as e:  # noqa: BLE001 -- a diagnosis only: the read goes on
            self.log.debug("waypost: %s: diagnosing %s failed: %r", self.registry_kind.scheme, self._what(), e)
            return
        if why and not self._first.done() and not self._last_error and self._notify(self._on_error, why):
            self._error_shown = True

    def _what(self) -> str:
        """What is followed, for messages (``service 'greet' at ...``)."""
        return self._discovery.describe(self.service)

    def _first_list_within(self) -> float:
        """Seconds from the start to the first list's deadline: past the first read's own bound, so that its
        failure (naming why) comes first."""
        return max(self.timeout, self._discovery.read_timeout + START_GRACE if self._discovery.read_timeout else 0)

    def _no_list_error(self) -> str:
        """A blocking start's error when the first list's deadline passed: the kind's ``Words.no_list`` when a
        read failed, naming why."""
        kind, within = self.registry_kind, self._first_list_within()
        if self._last_error:
            return kind.words.no_list.format(scheme=kind.scheme, list_name=kind.words.list_name, what=self._what(),
                                             within=within, why=self._last_error)
        return f"{kind.scheme}: no {kind.words.list_name} of {self._what()} within {within:g}s"

    def _failed(self, e: Exception) -> None:
        """A failed read: reported; a refusal ends a blocking start's wait with an error, a ``LookupFailed``
        (an answer) without one."""
        if isinstance(e, InvalidTarget | PermissionDenied):
            self._end_first_wait(e if isinstance(e, InvalidTarget) else RegistryUnavailable(str(e)))
            self._report(str(e))
            return
        answer = isinstance(e, LookupFailed)
        if answer:  # the channel hears it at once (never held for the first list)
            self._answered = True
        self._report(self.registry_kind.words.read_failed.format(
            title=self.registry_kind.title, what=self._what(), error=str(e) or type(e).__name__))
        if answer:  # then a blocking start returns, the channel knowing why
            self._end_first_wait()

    def _give_up_first(self) -> None:
        """The first list's deadline: a blocking start fails naming why, and the channel hears it whatever
        ``report_early`` says (calls stop waiting for a list that is not coming)."""
        if self._first.done():
            return
        why = self._last_error
        self._end_first_wait(RegistryUnavailable(self._no_list_error()))
        if why:
            self._report(why)

    def _end_first_wait(self, error: BaseException | None = None) -> None:
        """The first list is known (no ``error``), or will not come: a blocking start raises ``error``."""
        if self._first.done():
            return
        if error is None:
            self._first.set_result(None)
        else:
            self._first.set_exception(error)

    def _read_worked(self) -> bool:
        """A read worked: True when it ends a failure (the caller says so in the log); clears the failure."""
        ended = bool(self._failing or self._last_error)
        self._failing, self._last_error = 0, ""
        return ended

    def _report(self, msg: str) -> None:
        """A failure: logged (one WARNING per new reason, DEBUG while it repeats), remembered, and passed to
        ``on_error`` unless held back: until the first list, without ``report_early`` (a ``LookupFailed``, an
        answer, is never held)."""
        noun = self.registry_kind.words.instances
        (self.log.warning if msg != self._last_error and not self.quiet else self.log.debug)(
            "waypost: %s; %s", msg, f"keeping the last {noun}" if self._last is not None else f"no {noun} yet")
        self._last_error = msg
        holding = not self._answered and not (self.report_early or self._first.done())
        if not holding and self._notify(self._on_error, msg):
            self._error_shown = True

    def _push(self, backends: tuple[Backend, ...]) -> None:
        """Hand ``backends`` to the channel (subset) unless it has it already; the first list ends a blocking
        start's wait. After an error was shown the list goes again even when unchanged: an update is what tells
        the channel the resolver works again (it drops the error from its messages)."""
        if backends != self._last or self._error_shown:
            out: Sequence[Backend] = list(backends)
            if self.subsetter is not None:
                out = self.subsetter.select(out)
            self.log.debug("waypost: %s: %s -> %s", self.registry_kind.scheme, self._what(),
                           [b.address for b in backends])
            if self._notify(self._on_update, out):
                self._last = backends
                self._error_shown = False
                self.pushes += 1
                self.last_push_at = self._clock()
        self._end_first_wait()

    def _notify(self, fn: Callable[[Any], None] | None, arg: Any) -> bool:
        return fn is not None and notify(fn, arg, self.target)
