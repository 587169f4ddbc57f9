"""The picker wrapper: the current picker snapshot, the pick, waiting for a pick, and the error text.

The balancer wrapper (``balancer_wrapper``) publishes a new immutable ``PickerSnapshot`` after every change;
the data plane reads ``snap`` without a lock: a pick is one attribute read, the policy's pick and a dict
lookup. When nothing can be picked, the snapshot also says whether a call should wait (something is still
connecting, resolution is pending) and why it fails otherwise (every backend's state, the resolver error).
A retry whose pick went to a backend it already tried takes the same slow path (``next_pick``), and so does a
call refused for now because every backend is at its concurrency limit (``concurrency_limit.AtLimit``: it waits
whatever its ``wait_for_ready``, bounded by its deadline, and the policy's ``wake`` ends the wait when a call
ends there). A sync call waits here (``wait_pick``, on ``cond``); a grpc.aio call awaits the same steps on its
loop (``aio_wait``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

import grpc

from ..balancer.base import Picker, PickError, PickInfo, PickResult
from ..balancer.concurrency_limit import AtLimit
from ..errors import NoBackendAvailable
from .retry import avoid_tried
from .rpcerror import BalancerRpcError
from .subconn import SubConn

_mono = time.monotonic


class PickerSnapshot:
    """One published state: the picker over the usable backends and what a failing call needs to know.

    ``ready``: the subconns the picker may return, by address. ``backends``: every current subconn (their
    states are read live when describing). ``recover``: set in a forked child until the first use rebuilds
    the backend channels (called by the first call that finds nothing to pick). ``note``: why there are no
    backends (the channel's ``metadata_filter`` dropped them all; nothing is registered under the key);
    ``note_due``: a fuller note is on its way until this ``time.monotonic()`` (the close keys of an empty key,
    ``empty_key.py``): a call that would fail waits for it until then.
    """

    __slots__ = ("backends", "closed", "note", "note_due", "picker", "ready", "recover", "resolved", "resolver_error")

    def __init__(self, picker: Picker | None, ready: dict[str, SubConn], backends: tuple[SubConn, ...] = (), *,
                 resolved: bool = False, resolver_error: str | None = None, closed: bool = False,
                 recover: Callable[[], None] | None = None, note: str | None = None,
                 note_due: float | None = None) -> None:
        self.picker = picker
        self.ready = ready
        self.backends = backends
        self.resolved = resolved
        self.resolver_error = resolver_error
        self.closed = closed
        self.recover = recover
        self.note = note
        self.note_due = note_due


EMPTY = PickerSnapshot(None, {})


class PickerWrapper:
    """Holds the current ``PickerSnapshot`` of one channel; calls pick from it and wait on ``cond``."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.snap = EMPTY
        #: Bumped with every publish and ``wake`` (under ``cond``): a waiting call re-picks when it moved.
        self.version = 0
        self.cond = threading.Condition(threading.Lock())
        #: called by ``wake`` (a grpc.aio channel's waiter: its calls wait on its loop, not on ``cond``)
        self.on_wake: Callable[[], None] | None = None

    # ---- publishing (balancer wrapper) ------------------------------------------------------------

    def publish(self, snap: PickerSnapshot) -> None:
        """Swap in ``snap`` and wake the calls waiting for a pick."""
        with self.cond:
            self.snap = snap
            self.version += 1
            self.cond.notify_all()

    def wake(self) -> None:
        """A backend at its concurrency limit can take a call again (the policy's waker): the waiting calls
        pick again. From the thread that ended the call (a grpc.aio channel's: its loop)."""
        with self.cond:
            self.version += 1
            self.cond.notify_all()
        on_wake = self.on_wake
        if on_wake is not None:
            on_wake()

    def reset_after_fork(self, snap: PickerSnapshot) -> None:
        """In a forked child (one thread, locks possibly held by threads that no longer exist): a fresh
        condition and ``snap``, without taking any lock."""
        self.cond = threading.Condition(threading.Lock())
        self.snap = snap
        self.version += 1

    # ---- data plane -------------------------------------------------------------------------------

    def pick(self, info: PickInfo) -> tuple[PickResult, SubConn] | None:
        """A READY backend for this call, or None when there is none right now (the caller decides to wait
        or fail). Raises PickError when the policy rejects the call."""
        try:
            return self._pick(info)
        except AtLimit:
            return None

    def _pick(self, info: PickInfo) -> tuple[PickResult, SubConn] | None:
        """``pick``, raising ``AtLimit`` when every backend is at its concurrency limit (the call waits)."""
        snap = self.snap
        picker = snap.picker
        if picker is None:
            return None
        try:
            res = picker.pick(info)
        except AtLimit:
            raise
        except NoBackendAvailable:
            return None
        return res, snap.ready[res.backend.address]

    def next_pick(self, info: PickInfo, wait_for_ready: bool | None, tried: Collection[str] = ()
                  ) -> tuple[PickResult, SubConn] | None:
        """One step of the slow path of a pick, shared by the sync and aio waits: the pick to use, or None to
        wait for the next published picker. ``tried``: a retry's earlier backends, avoided as ``avoid_tried``
        says (waiting for an untried one still connecting). Raises UNAVAILABLE when nothing is worth
        waiting for, and the policy's error when it rejects the call."""
        try:
            try:
                r = self._pick(info)
            except AtLimit:
                return None  # not a failure: wait for a call to end at a backend (``wake``) or for a new picker
            if r is None:
                if not self.should_wait(wait_for_ready):
                    raise self.unavailable()
                return None
            if tried and r[1].address in tried:
                snap = self.snap
                return avoid_tried(r, tried, snap.ready.values(), snap.backends, lambda: self.pick(info))
        except PickError as e:
            raise BalancerRpcError(e.code, e.message) from None
        return r

    def wait_pick(self, info: PickInfo, deadline: float | None, wait_for_ready: bool | None,
                  tried: Collection[str] = ()) -> tuple[PickResult, SubConn]:
        """The slow path of a blocking pick (no usable backend right now, or a retry whose pick was tried
        already): ``next_pick`` until it gives a pick, waiting on ``cond`` in between, bounded by the
        deadline (DEADLINE_EXCEEDED once it passes)."""
        while True:
            version = self.version
            r = self.next_pick(info, wait_for_ready, tried)
            if r is not None:
                return r
            cond = self.cond
            with cond:
                if self.version != version:
                    continue
                if deadline is None:
                    cond.wait(1.0)
                else:
                    remaining = deadline - _mono()
                    if remaining <= 0:
                        raise self.deadline_exceeded(bool(tried))
                    cond.wait(min(remaining, 1.0))

    def ready_addresses(self) -> list[str]:
        return list(self.snap.ready)

    # ---- when nothing can be picked ---------------------------------------------------------------

    def should_wait(self, wait_for_ready: bool | None) -> bool:
        """With no usable backend: wait (True) or fail at once (False)?"""
        snap = self.snap
        if snap.recover is not None:
            snap.recover()
            return True
        if snap.closed:
            return False
        if wait_for_ready:
            return True
        if snap.note_due is not None and _mono() < snap.note_due:
            return True  # why it fails is still being looked up (bounded): the failure then says it in full
        if not snap.resolved:
            # Resolution pending: wait for the first list, unless the resolver already reported a failure.
            return snap.resolver_error is None
        # A backend usable but not yet in the picker: its state changed a moment ago and the new picker is
        # being published (the connectivity poller runs on its own thread): wait for it, do not fail.
        return any(sc.connecting or (sc.usable and sc.address not in snap.ready) for sc in snap.backends)

    def unavailable(self) -> BalancerRpcError:
        """The error for a call that cannot wait: names the target and every backend's state."""
        if self.snap.closed:
            return BalancerRpcError(grpc.StatusCode.CANCELLED, f"channel to {self.target} is closed")
        return BalancerRpcError(grpc.StatusCode.UNAVAILABLE, f"no READY backend for {self.target}: {self.describe()}")

    def deadline_exceeded(self, retry: bool = False) -> BalancerRpcError:
        """``retry``: the call was waiting for a backend its earlier attempts had not tried yet."""
        what = "a READY backend not tried yet by this call" if retry else "a READY backend"
        return BalancerRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"deadline exceeded while waiting for {what} of {self.target}: {self.describe()}",
        )

    def describe(self) -> str:
        """Every backend's state and the resolver error, for error details."""
        snap = self.snap
        err = f" (resolver: {snap.resolver_error})" if snap.resolver_error else ""
        if not snap.resolved:
            return "address resolution pending" + err
        if not snap.backends:
            return (snap.note or "resolver returned no backends") + err
        return ", ".join(sc.describe() for sc in snap.backends) + err
