"""LoadAwarePolicy: what the policies that keep per-backend load share (least_request, p2c_ewma, peak_ewma).

Each keeps one state object per backend across rebuilds (a ``StatsTable``), honours registered weights through a
``CapacityMemo`` and ramps new backends up with ``slow_start``. A rebuild does the same three steps in each, under
the policy's lock because the done hooks of calls still in flight update the same state: split the backends by
weight, tell slow start how many there are, and keep the state of the addresses still there. Each may carry a
per-backend concurrency limit (``concurrency_limit``, the ``concurrencyLimit`` field): ``limits`` and ``wake``.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from ..types import Backend
from . import concurrency_limit, slow_start
from .base import Policy
from .stats import StatsTable
from .weights import Capacity, CapacityMemo

S = TypeVar("S")


class LoadAwarePolicy(Policy, Generic[S]):
    """A policy with per-backend state of type ``S``, weights and slow start; subclasses build their picker from
    ``self._rebuild(backends)``."""

    #: where a bad registered weight is logged (each policy's own logger, so the line names the policy)
    log: ClassVar[logging.Logger]

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.slow_start = slow_start.SlowStart.of(self.config, self.rng)
        #: guards the per-backend state; the policy's pickers take it too while they read that state
        self.lock = threading.Lock()
        self._capacity = CapacityMemo(self.log)
        self._stats: StatsTable[S] = StatsTable(self._new_stats)
        #: the per-backend concurrency limit (``concurrency_limit``; None: off) and the channel's wake-up
        self.limits = concurrency_limit.settings_of(self.config)
        self.wake: Callable[[], None] | None = None

    def attach_waker(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def _freed(self) -> None:
        """A backend at its concurrency limit can take a call again (outside the lock): wake the waiting calls."""
        wake = self.wake
        if wake is not None:
            wake()

    @abc.abstractmethod
    def _new_stats(self, backend: Backend) -> S:
        """The state of a backend seen for the first time."""

    def _on_rebuild(self, now: float) -> None:
        """Called under the lock before the new backends' state is made (peak_ewma seeds their estimate here)."""

    def _rebuild(self, backends: Sequence[Backend]) -> tuple[Capacity, list[S]]:
        """The backends kept by their weights, and their state index for index."""
        capacity = self._capacity.split(backends)
        now = self.clock()
        with self.lock:
            self._on_rebuild(now)
            self.slow_start.on_build(now, len(capacity.backends))
            stats = self._stats.sync(capacity.backends)
        return capacity, stats
