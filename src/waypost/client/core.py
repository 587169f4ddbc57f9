"""The Balancer: backend set, READY tracking and picker swaps, shared by the sync and aio channels.

Mutations (address updates, connectivity and health changes) take ``_lock`` and end by swapping in a new
immutable ``_Snapshot`` (picker + the subconns it can return). The data plane reads ``_snap`` without a
lock: a pick is one attribute read, the policy's pick, and a dict lookup.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from .. import metrics as _metrics
from ..balancer.base import Backend, Picker, PickInfo, PickResult, Policy
from ..errors import NoBackendAvailable
from .rpcerror import BalancerRpcError
from .subconn import READY, SHUTDOWN, TRANSIENT_FAILURE, SubConn

log = logging.getLogger("waypost.client")

#: Removed backends keep their channel until their in-flight calls end, at most this long.
DRAIN_TIMEOUT = 60.0
#: ... and at least this long: a call may have picked the backend from the previous snapshot a moment before
#: its removal and not yet started (closing a grpc channel under a call being created crashes grpc). An
#: address that comes back meanwhile gets its old channel back (no reconnect under registration flapping).
CLOSE_GRACE = 1.0


class _Snapshot:
    __slots__ = ("picker", "subconns")

    def __init__(self, picker: Picker | None, subconns: dict[str, SubConn]) -> None:
        self.picker = picker
        self.subconns = subconns


_EMPTY = _Snapshot(None, {})

_live: weakref.WeakSet[Balancer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Inherited grpc channels are unusable in the child; drop them lazily on first use (no grpc calls here).
    # The lock may have been held by a parent thread (the connectivity poller) at the fork: a new one.
    for b in list(_live):
        b._lock = threading.RLock()
        b.cond = threading.Condition(b._lock)
        b._stale = True
        b._snap = _EMPTY


if hasattr(__import__("os"), "register_at_fork"):
    __import__("os").register_at_fork(after_in_child=_after_fork_in_child)


class Balancer:
    """Keeps one SubConn per backend address and the current picker over the usable ones.

    ``make_channel(address)`` creates a backend channel, ``probe(channel)`` returns a function
    ``f(try_to_connect) -> int`` giving its connectivity (0 IDLE .. 4 SHUTDOWN; it is called every poll, so
    it should be a direct C-level bound method where possible), ``close_channel(channel)`` releases it.
    ``start_health(subconn)`` (optional) starts a health watch that reports through ``set_health``; it
    returns a handle that ``stop_health(handle)`` cancels.
    """

    def __init__(
        self,
        target: str,
        policy: Policy,
        *,
        make_channel: Callable[[str], Any],
        probe: Callable[[Any], Callable[[bool], int]],
        close_channel: Callable[[Any], None],
        health_service: str | None = None,
        start_health: Callable[[SubConn], Any] | None = None,
        stop_health: Callable[[Any], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.policy = policy
        self._make_channel = make_channel
        self._probe = probe
        self._close_channel = close_channel
        self.health_service = health_service
        self._start_health = start_health
        self._stop_health = stop_health
        self._clock = clock
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)
        self._snap = _EMPTY
        self._subconns: dict[str, SubConn] = {}
        self._order: list[Backend] = []
        self._draining: list[SubConn] = []
        self._resolved = False
        self._resolver_error: str | None = None
        self._closed = False
        self._stale = False
        self._listeners: list[Callable[[], None]] = []
        self._dirty = False
        self._last_backends: tuple[Backend, ...] = ()
        self.version = 0
        #: Called (under the lock, so it must not block) with a reason when a backend connection attempt fails
        #: or an established connection is lost; the channel points it at the resolver (dns re-resolves).
        self.on_connection_failure: Callable[[str], None] | None = None
        _live.add(self)

    # ---- data plane -------------------------------------------------------------------------------

    def pick(self, info: PickInfo) -> tuple[PickResult, SubConn] | None:
        """A READY backend for this call, or None when there is none right now (the caller decides to wait
        or fail). Raises PickError when the policy rejects the call."""
        snap = self._snap
        picker = snap.picker
        if picker is None:
            return None
        try:
            res = picker.pick(info)
        except NoBackendAvailable:
            return None
        return res, snap.subconns[res.backend.address]

    def should_wait(self, wait_for_ready: bool | None) -> bool:
        """With no usable backend: wait (True) or fail at once (False)?"""
        if self._stale:
            self.refresh_after_fork()
            return True
        if self._closed:
            return False
        if wait_for_ready:
            return True
        if not self._resolved:
            # Resolution pending: wait for the first list, unless the resolver already reported a failure.
            return self._resolver_error is None
        return any(sc.connecting for sc in list(self._subconns.values()))

    def unavailable(self) -> BalancerRpcError:
        """The error for a call that cannot wait: names the target and every backend's state."""
        if self._closed:
            return BalancerRpcError(grpc.StatusCode.CANCELLED, f"channel to {self.target} is closed")
        return BalancerRpcError(grpc.StatusCode.UNAVAILABLE, f"no READY backend for {self.target}: {self.describe()}")

    def deadline_exceeded(self) -> BalancerRpcError:
        return BalancerRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"deadline exceeded while waiting for a READY backend of {self.target}: {self.describe()}",
        )

    def describe(self) -> str:
        if self._resolver_error:
            err = f" (resolver: {self._resolver_error})"
        else:
            err = ""
        if not self._resolved:
            return "address resolution pending" + err
        scs = list(self._subconns.values())
        if not scs:
            return "resolver returned no backends" + err
        return ", ".join(sc.describe() for sc in scs) + err

    def call_failed(self, sc: SubConn, code: grpc.StatusCode) -> None:
        """A call on ``sc`` ended with ``code``: on UNAVAILABLE, demote the backend at once if its connection
        is no longer READY (the shared watcher would see it within one poll anyway)."""
        if code is not grpc.StatusCode.UNAVAILABLE or sc.removed:
            return
        try:
            st = sc.probe(False)
        except Exception:  # noqa: BLE001  # channel closed under us: nothing to demote
            return
        if st != READY and sc.state == READY:
            with self._lock:
                self._set_state(sc, st)
                self._rebuild()
            self._fire()

    # ---- control plane ----------------------------------------------------------------------------

    def update(self, backends: Sequence[Backend]) -> None:
        """The resolver's new backend list (already subset). Keeps channels of addresses that stay."""
        if self._closed:
            return
        with self._lock:
            self._last_backends = tuple(backends)
            new: dict[str, Backend] = {}
            for b in backends:
                new.setdefault(b.address, b)
            added = [a for a in new if a not in self._subconns]
            gone = [a for a in self._subconns if a not in new]
            if added or gone:  # one line per address-set change, never per call
                log.info("waypost: %s: %d backends (+%s -%s)", self.target, len(new),
                         ",".join(added) or "0", ",".join(gone) or "0")
            for addr, sc in list(self._subconns.items()):
                if addr not in new:
                    self._remove(sc)
            for addr, b in new.items():
                cur = self._subconns.get(addr)
                if cur is None:
                    self._subconns[addr] = self._revive(b) or self._create(b)
                elif cur.backend != b:
                    cur.backend = b  # metadata (e.g. weight) changed: the next build carries it
            self._order = list(new.values())
            self._resolved = True
            self._resolver_error = None
            self._rebuild()
        self._fire()

    def resolver_error(self, message: str) -> None:
        """The resolver failed; keep the last addresses, remember why for error messages."""
        with self._lock:
            self._resolver_error = message
            self._changed()
        self._fire()

    def _create(self, b: Backend) -> SubConn:
        sc = SubConn(b, self._make_channel(b.address), health=self._start_health is not None)
        sc.probe = self._probe(sc.channel)
        try:
            # Start connecting now so the first call does not wait for the next poll.
            sc.state = sc.probe(True)
        except Exception:
            log.exception("waypost: could not query backend channel %s", b.address)
        if self._start_health is not None:
            sc.health_task = self._start_health(sc)
        return sc

    def _remove(self, sc: SubConn) -> None:
        # Never closed here: the poller closes it after CLOSE_GRACE once its in-flight calls ended.
        del self._subconns[sc.address]
        sc.removed = True
        sc.removed_at = self._clock()
        self._stop_health_of(sc)
        self._draining.append(sc)

    def _revive(self, b: Backend) -> SubConn | None:
        """A draining subconn for this address, back in service with its open channel (or None)."""
        for i, sc in enumerate(self._draining):
            if sc.address == b.address:
                del self._draining[i]
                sc.removed = False
                sc.backend = b
                try:
                    self._set_state(sc, sc.probe(True))
                except Exception:  # noqa: BLE001  # the next poll retries
                    log.debug("waypost: probing revived backend %s failed", sc.address)
                if self._start_health is not None:
                    sc.healthy = None
                    sc.health_task = self._start_health(sc)
                return sc
        return None

    def _stop_health_of(self, sc: SubConn) -> None:
        if sc.health_task is not None and self._stop_health is not None:
            try:
                self._stop_health(sc.health_task)
            except Exception:
                log.exception("waypost: stopping health watch of %s", sc.address)
            sc.health_task = None

    def _release(self, sc: SubConn) -> None:
        obs = _metrics.current
        if obs is not None:
            obs.backend_removed(self.target, sc.address)
        sc.mcs.clear()
        try:
            self._close_channel(sc.channel)
        except Exception:
            log.exception("waypost: closing backend channel %s", sc.address)

    def set_health(self, sc: SubConn, healthy: bool | None, note: str = "") -> None:
        """Health watch result for ``sc`` (None: unknown, e.g. the Watch stream broke)."""
        with self._lock:
            if sc.removed or sc.healthy is healthy:
                sc.health_note = note
                return
            if healthy is False or (sc.healthy is True and healthy is None):
                log.info("waypost: backend %s of %s unhealthy: %s", sc.address, self.target, note or "NOT_SERVING")
            sc.healthy = healthy
            sc.health_note = note
            self._rebuild()
        self._fire()

    def poll(self) -> None:
        """Refresh every backend's connectivity (called by the shared watcher every few tens of ms)."""
        if self._closed or self._stale:
            return
        changed = []
        for sc in list(self._subconns.values()):  # hot: every backend, every poll
            try:
                st = sc.probe(True)
            except Exception:  # noqa: BLE001, S112  # closed by a concurrent removal
                continue
            if st != sc.state:
                changed.append((sc, st))
        if changed:
            with self._lock:
                for sc, st in changed:
                    if not sc.removed:
                        self._set_state(sc, st)
                self._rebuild()
            self._fire()
        if self._draining:
            now = self._clock()
            with self._lock:
                keep = []
                for sc in self._draining:
                    age = now - sc.removed_at
                    if (sc.inflight <= 0 and age >= CLOSE_GRACE) or age > DRAIN_TIMEOUT:
                        self._release(sc)
                    else:
                        keep.append(sc)
                self._draining = keep

    def _set_state(self, sc: SubConn, st: int) -> None:
        old = sc.state
        if st == READY:
            if sc.failing:
                log.info("waypost: backend %s of %s is READY again", sc.address, self.target)
            sc.failing = False
        elif st == TRANSIENT_FAILURE or old == READY or st == SHUTDOWN:
            if old == READY:
                log.info("waypost: backend %s of %s lost its connection", sc.address, self.target)
            if not sc.failing and self.on_connection_failure is not None:
                try:
                    self.on_connection_failure(f"connection to {sc.address} failed")
                except Exception:
                    log.exception("waypost: connection failure hook of %s", self.target)
            sc.failing = True
        sc.state = st

    def _rebuild(self) -> None:
        # Caller holds _lock. Build the picker from usable backends in resolver order.
        usable: dict[str, SubConn] = {}
        backends: list[Backend] = []
        for b in self._order:
            sc = self._subconns.get(b.address)
            if sc is not None and sc.usable:
                usable[b.address] = sc
                backends.append(sc.backend)
        snap = self._snap
        if backends and snap.picker is not None and list(snap.subconns) == list(usable) and all(
            snap.subconns[a].backend is usable[a].backend for a in usable
        ):
            self._changed()  # same usable set: keep the picker (its state, e.g. a round-robin position)
            return
        picker = self.policy.build(backends) if backends else None
        self._snap = _Snapshot(picker, usable)
        self._changed()
        obs = _metrics.current
        if obs is not None:
            obs.picker_rebuilt(self.target)

    def _changed(self) -> None:
        # Caller holds _lock: wake waiting calls now; listeners run after the lock is released (_fire).
        self.version += 1
        self._dirty = True
        self.cond.notify_all()

    def _fire(self) -> None:
        """Run the change listeners outside the lock (they may call back into the channel)."""
        if not self._dirty:
            return
        self._dirty = False
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:
                log.exception("waypost: balancer listener failed")

    def add_listener(self, fn: Callable[[], None]) -> None:
        """fn() after every change of backend states (from whatever thread made the change)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def connectivity(self) -> int:
        """Aggregate state: READY if any backend is usable, else CONNECTING/TRANSIENT_FAILURE/IDLE."""
        if self._closed:
            return SHUTDOWN
        if self._snap.picker is not None:
            return READY
        scs = list(self._subconns.values())
        if not self._resolved or any(sc.connecting for sc in scs):
            return 1
        return TRANSIENT_FAILURE if scs else 0

    def subconns(self) -> list[SubConn]:
        """Current backends (a copy), for tests and introspection."""
        return list(self._subconns.values())

    def ready_addresses(self) -> list[str]:
        return list(self._snap.subconns)

    def refresh_after_fork(self) -> None:
        """In a forked child: replace every inherited backend channel with a fresh one."""
        with self._lock:
            if not self._stale:
                return
            self._stale = False
            self._subconns = {}
            self._draining = []
            self._snap = _EMPTY
            backends, self._order = self._last_backends, []
            self._resolved = False
        self.update(backends)
        self._on_refork()

    def _on_refork(self) -> None:
        """Hook for the channel (restart the watcher registration)."""

    def close(self) -> None:
        """Release every backend channel; waiting calls fail at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            scs = list(self._subconns.values()) + self._draining
            self._subconns = {}
            self._draining = []
            self._snap = _EMPTY
            for sc in scs:
                sc.removed = True
                self._stop_health_of(sc)
                self._release(sc)
            self._changed()
        self._fire()
        _live.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed


def attach_resolver(resolver: Any, balancer: Balancer, options: Sequence[tuple[str, Any]]) -> None:
    """Give a resolver what it may use beyond start(): the channel options (``configure``, e.g. dns
    intervals; may raise ValueError) and a nudge when a backend connection fails (``request_resolution``)."""
    configure = getattr(resolver, "configure", None)
    if configure is not None:
        configure(options)
    balancer.on_connection_failure = getattr(resolver, "request_resolution", None)
