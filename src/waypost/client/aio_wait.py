"""Waiting on the event loop for a grpc.aio channel's next change, and the awaitable slow path of a pick.

The sync slow path blocks a thread on ``PickerWrapper.cond``; a grpc.aio call must not block its loop, so it
awaits an ``asyncio.Event`` that the balancer wrapper's change listener sets (``AioPickWaiter.changed``; the
aio channel's updates all run on its loop). The channel's own waits (``wait_for_state_change``,
``channel_ready``) await the same event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from contextlib import suppress

from ..balancer.base import PickInfo, PickResult
from .picker_wrapper import PickerWrapper
from .subconn import SubConn

_mono = time.monotonic


class AioPickWaiter:
    """One grpc.aio channel's change event and its waiting picks.

    ``before_wait`` runs before anything waits: a channel made outside any event loop starts its work on the
    loop there (its connectivity poller, the resolver updates it received meanwhile), else nothing would ever
    change.
    """

    def __init__(self, pickers: PickerWrapper, before_wait: Callable[[], None]) -> None:
        self.pickers = pickers
        self.before_wait = before_wait
        #: Set (and replaced by a fresh one) at every change of the channel's backends.
        self.event = asyncio.Event()

    def changed(self) -> None:
        """The balancer wrapper's change listener: wake everything waiting for a change."""
        ev, self.event = self.event, asyncio.Event()
        ev.set()

    async def wait_pick(self, info: PickInfo, deadline: float | None, wfr: bool | None,
                        tried: Collection[str] = ()) -> tuple[PickResult, SubConn]:
        """The slow path of a pick (no usable backend right now, or a retry whose pick was tried already):
        ``PickerWrapper.next_pick`` until it gives a pick, awaiting the next change in between, bounded by
        the deadline (DEADLINE_EXCEEDED once it passes)."""
        self.before_wait()
        b = self.pickers
        while True:
            ev = self.event
            r = b.next_pick(info, wfr, tried)
            if r is not None:
                return r
            wait = 1.0
            if deadline is not None:
                wait = deadline - _mono()
                if wait <= 0:
                    raise b.deadline_exceeded(bool(tried))
                wait = min(wait, 1.0)
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), wait)
