"""The base of the resolvers that follow their source from one task on the control loop (consul, k8s, zk, dns).

What such a resolver does, done once here:

- ``start(on_update, on_error)`` starts the task. With ``options.blocking`` (sync dial) it returns once the first
  list is known; it raises ``RegistryUnavailable`` when there is none within ``_first_list_within()`` seconds
  (naming why: the last failure) or at once when a failure is one a retry will not cure (``_end_first_wait``
  with an error). Without it (aio dial), it returns at once.
- The task enters the subclass' ``_session`` (what stays open across reads: a client) and calls ``_follow``
  again and again: one read, or one watch, returning when it must be called again. When ``_follow`` raises, the
  failure is described (``_describe``), logged (a WARNING for a new reason, DEBUG when it repeats) and reported,
  and the next try waits ``backoff`` (the channel keeps the last list meanwhile).
- ``options.report_early``: until the first list, failures reach ``on_error`` only with it (calls then fail at once
  naming the reason); without it they wait for the first list's deadline, when the reason is reported anyway.
- ``_push(backends)`` hands a list to the channel (subset) when it changed, or after an error was shown (the
  update tells the channel the resolver works again), and ends a blocking start's wait.
- ``resolve_now`` is a no-op unless the subclass re-reads on request; ``close`` and ``aclose`` end the task.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from .. import _loop
from ..backoff import RECONNECT, Backoff
from ..errors import RegistryUnavailable, WaypostError
from ..types import Backend
from .base import OnError, OnUpdate, ResolverOptions, notify
from .target import Target

#: what a resolver keeps open while it follows its source (a registry client), handed to each ``_follow``
Session = TypeVar("Session")

#: how much longer than the first list's deadline a blocking start waits: the loop gives up at the deadline
#: itself, with the reason it knows; this only bounds a loop that cannot run at all
START_GRACE = 1.0


class LoopResolver(abc.ABC, Generic[Session]):
    """A resolver driven by one task on the control loop; see the module docstring.

    Subclasses set ``kind`` (the scheme, for messages), ``noun`` (what a list holds, for log lines), ``list_name``
    (what the first list is called in a start's error) and ``log``, and implement ``_session``, ``_follow``,
    ``_what``, ``_describe`` and ``_first_list_within``. ``rng`` (jitter) and ``clock`` are for tests.
    """

    kind: str
    noun: str
    list_name: str
    log: logging.Logger
    #: the pause after failures in a row
    backoff: Backoff = RECONNECT

    def __init__(self, target: Target, options: ResolverOptions | None, *, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        options = options if options is not None else ResolverOptions()
        self.target = target
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.report_early = options.report_early
        self.quiet = options.quiet
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._future: concurrent.futures.Future[None] | None = None
        # done once the first list is known, or given up (an error, raised by a blocking start)
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._closed = False
        self._on_update: OnUpdate | None = None
        self._on_error: OnError | None = None
        self._last: tuple[Backend, ...] | None = None  # the last list the channel took
        self._last_error = ""
        self._error_shown = False  # the channel was told of an error since the last push
        self._failing = 0  # failed reads in a row (0: the last read worked)
        #: pushes to the channel so far (introspection and tests)
        self.pushes = 0
        #: clock time of the last change pushed to the channel
        self.last_push_at: float | None = None

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
        """Nothing to do: the watch (or blocking query) already pushes every change."""

    def close(self) -> None:
        self._closed = True
        if self._future is not None:
            self._future.cancel()

    async def aclose(self) -> None:
        """close() never blocks: the same."""
        self.close()

    # ---- what a subclass gives ----------------------------------------------------------------------

    @abc.abstractmethod
    def _session(self) -> AbstractAsyncContextManager[Session]:
        """What stays open while the resolver runs (a client), handed to every ``_follow``."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _follow(self, session: Session) -> None:
        """Read once, or watch until the watch ends: return when it must be called again; raise when reading
        failed (the failure is reported and the next call waits ``backoff``)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _what(self) -> str:
        """What is followed, for messages (``service 'greet' at ...``)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _describe(self, e: Exception) -> str:
        """A failed read in words, for the channel and the log."""
        raise NotImplementedError

    @abc.abstractmethod
    def _first_list_within(self) -> float:
        """Seconds from the start to the first list's deadline."""
        raise NotImplementedError

    def _why_no_list(self) -> str:
        """Why there is no first list yet, at its deadline (default: the last failure)."""
        return self._last_error

    def _no_list_error(self) -> str:
        """A blocking start's error when the first list's deadline passed."""
        why = self._why_no_list()
        return (f"{self.kind}: no {self.list_name} of {self._what()} within {self._first_list_within():g}s"
                f"{f' ({why})' if why else ''}")

    def _failed(self, e: Exception) -> None:
        """A failed read (``_follow`` raised): reported; a subclass adds its own counting and refusals."""
        self._report(self._describe(e))

    def _log_failure(self, msg: str, new: bool, exc: BaseException | None) -> None:
        """One WARNING per new reason, DEBUG while it repeats; ``exc`` (not waypost's own): where it came from."""
        (self.log.warning if new and not self.quiet else self.log.debug)(
            "waypost: %s; %s", msg,
            f"keeping the last {self.noun}" if self._last is not None else f"no {self.noun} yet",
            exc_info=exc if new and exc is not None and not isinstance(exc, WaypostError) else None)

    # ---- the loop -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        deadline = asyncio.get_running_loop().call_later(self._first_list_within(), self._give_up_first)
        try:
            async with self._session() as session:
                while not self._closed:
                    try:
                        await self._follow(session)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001  # keep the last list, retry with backoff
                        self._failing += 1
                        self._failed(e)
                        await asyncio.sleep(self.backoff.delay(self._failing, self._rng))
        finally:
            deadline.cancel()

    def _give_up_first(self) -> None:
        """The first list's deadline: a blocking start fails naming why, and the channel hears it whatever
        ``report_early`` says (calls stop waiting for a list that is not coming)."""
        if self._first.done():
            return
        why = self._why_no_list()
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

    def _report(self, msg: str, exc: BaseException | None = None) -> None:
        """A failure: logged, remembered, and passed to ``on_error`` (before the first list: with
        ``report_early`` only)."""
        self._log_failure(msg, msg != self._last_error, exc)
        self._last_error = msg
        if not self._holding_errors() and self._notify(self._on_error, msg):
            self._error_shown = True

    def _holding_errors(self) -> bool:
        """Whether failures are kept from the channel for now: until the first list, without ``report_early``."""
        return not (self.report_early or self._first.done())

    def _push(self, backends: tuple[Backend, ...]) -> None:
        """Hand ``backends`` to the channel (subset) unless it has it already; the first list ends a blocking
        start's wait. After an error was shown the list goes again even when unchanged: an update is what tells
        the channel the resolver works again (it drops the error from its messages)."""
        if backends != self._last or self._error_shown:
            out: Sequence[Backend] = list(backends)
            if self.subsetter is not None:
                out = self.subsetter.select(out)
            self.log.debug("waypost: %s -> %s", self._label(), [b.address for b in backends])
            if self._notify(self._on_update, out):
                self._last = backends
                self._error_shown = False
                self.pushes += 1
                self.last_push_at = self._clock()
        self._end_first_wait()

    def _label(self) -> str:
        """What a debug line about this resolver starts with."""
        return f"{self.kind}: {self._what()}"

    def _notify(self, fn: Callable[[Any], None] | None, arg: Any) -> bool:
        return fn is not None and notify(fn, arg, self.target)


__all__ = ["START_GRACE", "LoopResolver", "Session"]
