"""The balancer wrapper: resolver updates, the subconn set, connectivity and health, picker rebuilds.

It sits between the resolver and the picker wrapper, as grpc-go's balancer wrapper does: it takes the
resolver's backend lists and errors, keeps one subconn per address the policy wants connected
(``SubConnPool``; ``Policy.connections``, by default every address), tracks each one's connectivity (polled)
and health, and after every change publishes a new ``PickerSnapshot`` to its ``PickerWrapper`` (built by the
policy from the usable backends in resolver order). Mutations take ``_lock``; the data plane never does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import grpc

from .. import metrics as _metrics
from ..balancer.base import Picker, Policy
from ..types import CONNECTING, IDLE, READY, SHUTDOWN, TRANSIENT_FAILURE, Backend
from . import live
from .empty_key import EmptyKey
from .picker_wrapper import PickerSnapshot, PickerWrapper
from .prober import SubConnProber
from .routing import Routing
from .subconn import SubConn
from .subconn_pool import SubConnPool

log = logging.getLogger("waypost.client")


class BalancerWrapper:
    """Keeps one SubConn per backend address the policy wants connected (``Policy.connections``: by default all;
    asked again after every change of the list or of a subconn's state, and on the first poll after the time
    ``Policy.connections_timer`` gave, e.g. pick_first's attempt delay) and publishes the picker over the
    usable ones to ``pickers``.

    ``make_channel``, ``probe``, ``close_channel``, ``start_health`` and ``stop_health``: see
    ``SubConnPool``. ``resolve_now(reason)`` is called (under the lock, so it must not block) when a backend
    connection attempt fails or an established connection is lost. ``on_refork()`` is called when the
    first use in a forked child has rebuilt the backends (see ``client.live``).

    A policy that balances on server load reports (``policy.wants_load_reports``) gets a ``SubConnProber`` over
    this wrapper's subconns before its first build.

    ``routing`` (``dial(metadata_filter=, prefer=)``): backends the filter drops are never connected to; the
    picker is built from the preferred READY backends while there are enough of them (``Routing.preferred``).
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
        resolve_now: Callable[[str], None] | None = None,
        on_refork: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        routing: Routing | None = None,
        empty: EmptyKey | None = None,
    ) -> None:
        self.target = target
        self.policy = policy
        policy.target = target  # for the policy's own metrics (A78's grpc.lb.*)
        self.health_service = health_service
        self.pickers = PickerWrapper(target)
        self._pool = SubConnPool(target, make_channel=make_channel, probe=probe, close_channel=close_channel,
                                 start_health=start_health, stop_health=stop_health, clock=clock)
        self._clock = clock
        self._recheck_at: float | None = None  # when to ask policy.connections again (Policy.connections_timer)
        self._resolve_now = resolve_now
        self._on_refork = on_refork
        self._lock = threading.RLock()
        self._order: list[Backend] = []
        self._last_backends: tuple[Backend, ...] = ()
        self._resolved = False
        self._resolver_error: str | None = None
        self._routing = routing
        self._note: str | None = None  # why the (filtered) backend list is empty, for error details
        self._empty = empty  # a registry target's "nothing is registered under key ..." note
        self._resolved_count = -1  # backends in the resolver's last list, before any metadata_filter
        self._closed = False
        self._stale = False  # in a forked child until the first use rebuilds (see mark_forked)
        self._listeners: list[Callable[[], None]] = []
        self._dirty = False
        self._prober: SubConnProber | None = None
        # only a policy that overrides ``connections`` is asked on every state change (the default wants all)
        self._selective = type(policy).connections is not Policy.connections
        if policy.wants_load_reports:
            # through the pool each time: the pool replaces its dict on close and after a fork
            self._prober = SubConnProber(lambda a: self._pool.active.get(a), policy, policy.probe_timeout)
            policy.attach_prober(self._prober)
        policy.attach_waker(self.pickers.wake)  # a call refused at every backend's concurrency limit waits for it
        live.install_after_fork_hook()
        live.track(self)

    # ---- resolver updates -------------------------------------------------------------------------

    def update(self, backends: Sequence[Backend]) -> None:
        """The resolver's new backend list (already subset). Keeps channels of addresses that stay."""
        if self._closed:
            return
        obs = _metrics.current
        if obs is not None:
            obs.resolver_update(self.target)
        pool = self._pool
        routing = self._routing
        resolved = len(backends)
        note = None
        if routing is not None and routing.filter is not None:
            backends, note = routing.admit(backends)
        elif not resolved and self._empty is not None:  # nothing registered: say so, look for close keys once
            note = self._empty.note()
            self._empty.look_up(self._empty_looked_up)
        self._note = note
        self._resolved_count = resolved
        with self._lock:
            self._last_backends = tuple(backends)
            new: dict[str, Backend] = {}
            for b in backends:
                new.setdefault(b.address, b)
            old = {b.address for b in self._order}
            added = [a for a in new if a not in old]
            gone = [a for a in old if a not in new]
            if added or gone:  # one line per address-set change, never per call
                log.info("waypost: %s: %d backends (+%s -%s)", self.target, len(new),
                         ",".join(added) or "0", ",".join(gone) or "0")
            meta_changed = False
            for addr, cur in pool.active.items():
                fresh = new.get(addr)
                if fresh is not None and cur.backend != fresh:
                    cur.backend = fresh  # metadata (e.g. weight) changed: a new picker carries it
                    meta_changed = True
            self._order = list(new.values())
            self._connect()
            self._resolved = True
            self._resolver_error = None
            self._rebuild(force=meta_changed)
        self._fire()

    def _connect(self) -> None:
        """Hold a subconn for each address the policy wants connected, of the resolver's list; let the others
        drain (caller holds ``_lock``)."""
        pool = self._pool
        # A policy takes a new connection for one still connecting; a revived one (a draining channel taken back)
        # may already be READY or failed: then the policy is asked again at once, not one poll or timer later.
        # Each further round follows a round that added an address, so len + 1 rounds bound it.
        for _ in range(len(self._order) + 1):
            wanted = self._wanted()
            for addr in [a for a in pool.active if a not in wanted]:
                pool.remove(pool.active[addr])
            settled = True
            for addr, b in wanted.items():
                if addr not in pool.active:
                    sc, revived = pool.add(b)
                    if revived:
                        self._probe_revived(sc)
                    if self._selective and _policy_state(sc) != CONNECTING:
                        settled = False
            if settled:
                return

    def _wanted(self) -> dict[str, Backend]:
        everything = {b.address: b for b in self._order}
        if not self._selective:
            return everything
        states = {a: _policy_state(sc) for a, sc in self._pool.active.items()}
        self._recheck_at = None
        try:
            chosen = self.policy.connections(self._order, states)
            timer = self.policy.connections_timer()
        except Exception:  # a policy bug must not leave the channel without connections
            log.exception("waypost: %s: %s.connections failed; connecting to every backend", self.target,
                          type(self.policy).__name__)
            return everything
        if timer is not None:
            self._recheck_at = self._clock() + timer
        if chosen is None:
            return everything
        return {a: b for a, b in everything.items() if a in chosen}

    def _changed(self) -> None:
        """After a subconn's state changed (caller holds ``_lock``): ask the policy again, rebuild the picker."""
        if self._selective:
            self._connect()
        self._rebuild()

    def _empty_looked_up(self) -> None:
        """The look-up of the close keys of an empty registry key ended: publish the fuller note if still empty
        (the calls waiting for it go on)."""
        with self._lock:
            if self._closed or self._resolved_count != 0 or self._empty is None or self._note is None:
                return
            self._note = self._empty.note()
            self._publish(self.pickers.snap.picker, self.pickers.snap.ready)
        self._fire()

    def resolver_error(self, message: str) -> None:
        """The resolver failed; keep the last addresses, remember why for error messages."""
        with self._lock:
            self._resolver_error = message
            self._publish(self.pickers.snap.picker, self.pickers.snap.ready)
        self._fire()

    @property
    def resolver_error_message(self) -> str | None:
        """The resolver's last failure, until its next successful update (None: no failure)."""
        return self._resolver_error

    # ---- connectivity -----------------------------------------------------------------------------

    def poll(self) -> None:
        """Refresh every backend's connectivity (called every few tens of ms by the channel's poller)."""
        if self._closed or self._stale:
            return
        changed = []
        for sc in list(self._pool.active.values()):  # hot: every backend, every poll
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
                self._changed()
            self._fire()
        elif self._recheck_at is not None and self._clock() >= self._recheck_at:
            # the policy's timer ran out with no state change (e.g. pick_first's attempt delay): ask it again
            with self._lock:
                if not self._closed and self._recheck_at is not None and self._clock() >= self._recheck_at:
                    self._changed()
            self._fire()
        if self._pool.draining:
            with self._lock:
                self._pool.reap()

    def call_failed(self, sc: SubConn, code: grpc.StatusCode) -> None:
        """A call on ``sc`` ended with ``code``: on UNAVAILABLE, demote the backend at once if its connection
        is no longer READY (the poller would see it within one poll anyway)."""
        if code is not grpc.StatusCode.UNAVAILABLE or sc.removed:
            return
        try:
            st = sc.probe(False)
        except Exception:  # noqa: BLE001  # channel closed under us: nothing to demote
            return
        if st != READY and sc.state == READY:
            with self._lock:
                self._set_state(sc, st)
                self._changed()
            self._fire()

    def _probe_revived(self, sc: SubConn) -> None:
        try:
            self._set_state(sc, sc.probe(True))
        except Exception:  # noqa: BLE001  # the next poll retries
            log.debug("waypost: probing revived backend %s failed", sc.address)

    def _set_state(self, sc: SubConn, st: int) -> None:
        old = sc.state
        if st == READY:
            if sc.failing:
                log.info("waypost: backend %s of %s is READY again", sc.address, self.target)
            sc.failing = False
        elif st == TRANSIENT_FAILURE or old == READY or st == SHUTDOWN:
            if old == READY:
                log.info("waypost: backend %s of %s lost its connection", sc.address, self.target)
            if not sc.failing and self._resolve_now is not None:
                try:
                    self._resolve_now(f"connection to {sc.address} failed")
                except Exception:
                    log.exception("waypost: re-resolution request of %s", self.target)
            sc.failing = True
        sc.state = st

    def connectivity(self) -> int:
        """Aggregate state: READY if any backend is usable, else CONNECTING / TRANSIENT_FAILURE / IDLE."""
        if self._closed:
            return SHUTDOWN
        if self.pickers.snap.picker is not None:
            return READY
        scs = list(self._pool.active.values())
        if not self._resolved or any(sc.connecting for sc in scs):
            return CONNECTING
        return TRANSIENT_FAILURE if scs else IDLE

    # ---- health -----------------------------------------------------------------------------------

    def set_health(self, sc: SubConn, healthy: bool | None, note: str = "") -> None:
        """Health watch result for ``sc`` (None: unknown, e.g. the Watch stream broke)."""
        with self._lock:
            if sc.removed or sc.healthy is healthy:
                return
            if healthy is False or (sc.healthy is True and healthy is None):
                log.info("waypost: backend %s of %s unhealthy: %s", sc.address, self.target, note or "NOT_SERVING")
            sc.healthy = healthy
            self._changed()
        self._fire()

    # ---- picker rebuilds and change listeners -----------------------------------------------------

    def _rebuild(self, force: bool = False) -> None:
        # Caller holds _lock. Build the picker from usable backends in resolver order (``force``: even for the
        # same usable set, e.g. after a metadata change: the SubConns are the same objects, their backend not).
        usable: dict[str, SubConn] = {}
        backends: list[Backend] = []
        active = self._pool.active
        for b in self._order:
            sc = active.get(b.address)
            if sc is not None and sc.usable:
                usable[b.address] = sc
                backends.append(sc.backend)
        routing = self._routing
        if routing is not None and routing.prefer is not None:
            chosen = routing.preferred(usable)
            if chosen is not usable:
                usable = chosen
                backends = [sc.backend for sc in chosen.values()]
        snap = self.pickers.snap
        if not force and backends and snap.picker is not None and list(snap.ready) == list(usable) and all(
            snap.ready[a].backend is usable[a].backend for a in usable
        ):
            # same usable set: keep the picker (its state, e.g. a round-robin position)
            self._publish(snap.picker, snap.ready)
            return
        self._publish(self.policy.build(backends) if backends else None, usable)
        obs = _metrics.current
        if obs is not None:
            obs.picker_rebuilt(self.target)

    def _publish(self, picker: Picker | None, ready: dict[str, SubConn]) -> None:
        # Caller holds _lock: wake waiting calls now; listeners run after the lock is released (_fire).
        empty = self._empty
        self.pickers.publish(PickerSnapshot(
            picker, ready, tuple(self._pool.active.values()), resolved=self._resolved,
            resolver_error=self._resolver_error, closed=self._closed, note=self._note,
            note_due=empty.due if empty is not None and self._note is not None and not ready else None))
        self._dirty = True

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
        with suppress(ValueError):
            self._listeners.remove(fn)

    # ---- introspection ----------------------------------------------------------------------------

    def subconns(self) -> list[SubConn]:
        """Current backends (a copy), for tests and introspection."""
        return list(self._pool.active.values())

    def draining(self) -> list[SubConn]:
        """Removed backends whose channel stays open while their calls finish (a copy)."""
        return list(self._pool.draining)

    def ready_addresses(self) -> list[str]:
        return self.pickers.ready_addresses()

    def describe(self) -> str:
        return self.pickers.describe()

    # ---- fork recovery (see client.live) ----------------------------------------------------------

    def mark_forked(self) -> None:
        """In a forked child, right after the fork (one thread, no grpc call allowed): fresh locks, and a
        snapshot whose first use rebuilds every backend channel (``_recover_after_fork``)."""
        self._lock = threading.RLock()
        self._stale = True
        self.pickers.reset_after_fork(PickerSnapshot(None, {}, recover=self._recover_after_fork))

    def _recover_after_fork(self) -> None:
        """In a forked child, on first use: replace every inherited backend channel with a fresh one."""
        with self._lock:
            if not self._stale:
                return
            self._stale = False
            self._pool.forget_after_fork()
            backends, self._order = self._last_backends, []
            self._resolved = False
            self._publish(None, {})
        self.update(backends)
        if self._on_refork is not None:
            self._on_refork()

    # ---- close ------------------------------------------------------------------------------------

    def close(self) -> list[SubConn]:
        """Release every backend channel (waiting calls fail at once); returns the subconns released.
        Idempotent (a second call returns nothing)."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            if self._prober is not None:
                self._prober.close()
            scs = self._pool.close_all()
            self._publish(None, {})
        self._fire()
        live.untrack(self)
        return scs

    @property
    def closed(self) -> bool:
        return self._closed


def _policy_state(sc: SubConn) -> int:
    """A subconn's state as ``Policy.connections`` sees it: READY only when usable (health included),
    CONNECTING while it is expected to become so, TRANSIENT_FAILURE otherwise."""
    if sc.usable:
        return READY
    return CONNECTING if sc.connecting else TRANSIENT_FAILURE
