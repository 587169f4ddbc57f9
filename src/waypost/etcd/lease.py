"""Lease keepalive: every lease of a client renewed on ONE bidirectional LeaseKeepAlive stream.

Each lease is renewed every ttl/3. The stream reconnects (to another endpoint if the member is
gone) and keeps renewing the same lease ids: leases survive an etcd restart. A lease is reported
lost, once, to its owners when etcd answers TTL <= 0 (it no longer exists) or when it could not be
renewed before its TTL ran out, counted from the sending of the last renewal etcd confirmed (a
lower bound of etcd's own deadline for it). A slow answer is not a loss: the stream is given up
only when the lease nears that deadline with its renewal unanswered (``_Lease.stall_at``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

import grpc
import grpc.aio

from .. import _loop
from ..errors import LeaseNotFound, PermissionDenied, RegistryUnavailable
from ._generated import waypost_etcd_pb2 as pb
from ._methods import LEASE_KEEPALIVE
from .auth import Auth, Metadata
from .endpoints import Endpoint, EndpointPool
from .stream import Restart, StreamOwner, StreamSupervisor, reap

log = logging.getLogger("waypost.etcd.lease")

LostCallback = Callable[[int, BaseException | None], None]

#: the stream carrying a renewal is given up when the lease is this close to its end (TTL share,
#: bounded): time left to renew on another member
SAFETY_SHARE = 0.2
SAFETY_MIN = 1.0
SAFETY_MAX = 3.0
#: and never before a renewal has waited this long (a fresh stream near the deadline gets a chance)
MIN_PATIENCE = 1.0


class LeaseKeepAlive:
    """Handle of a kept-alive lease; ``cancel()`` stops renewing (without revoking)."""

    def __init__(self, manager: KeepAliveManager, lease_id: int, on_lost: LostCallback) -> None:
        self.lease_id = lease_id
        self._manager = manager
        self._on_lost = on_lost
        self.lost: BaseException | None = None
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if _loop.in_loop():
                self._manager.remove(self)
            else:
                _loop.call_soon(self._manager.remove, self)

    def _report(self, reason: BaseException) -> None:
        if self.cancelled or self.lost is not None:
            return
        self.lost = reason
        try:
            self._on_lost(self.lease_id, reason)
        except Exception:
            log.exception("on_lost callback of lease %d raised", self.lease_id)

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else "lost" if self.lost is not None else "alive"
        return f"<LeaseKeepAlive {self.lease_id} {state}>"


class _Lease:
    __slots__ = ("expires", "handles", "lease_id", "next_send", "renewed", "sent", "ttl")

    def __init__(self, lease_id: int, ttl: int, now: float) -> None:
        self.lease_id = lease_id
        self.ttl = max(int(ttl), 1)
        self.next_send = now  # the first renewal goes out at once (it also checks existence)
        self.expires = now + self.ttl
        self.sent: collections.deque[float] = collections.deque()
        self.handles: list[LeaseKeepAlive] = []
        self.renewed = 0

    @property
    def interval(self) -> float:
        return max(self.ttl / 3.0, 0.1)

    def stall_at(self) -> float:
        """When to give up on the stream that carries this lease's oldest unanswered renewal.

        Judged by the lease's own deadline, not by how long one answer takes: a slow but working link
        (answers after seconds) keeps its stream as long as the answers arrive before the lease
        would end. Only when the deadline is ``SAFETY`` away with the renewal still unanswered does
        the stream move (to another member, if there is one), leaving time for a renewal there. A
        reconnect discards the answers still due on the old stream, so it is never done lightly.
        """
        margin = min(max(self.ttl * SAFETY_SHARE, SAFETY_MIN), SAFETY_MAX)
        return max(self.sent[0] + MIN_PATIENCE, self.expires - margin)


class KeepAliveManager(StreamOwner):
    """Runs the shared keepalive stream of one client (on the control loop)."""

    def __init__(self, pool: EndpointPool, auth: Auth, clock: Callable[[], float]) -> None:
        self.pool = pool
        self.clock = clock
        self._leases: dict[int, _Lease] = {}
        self._wake = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self.stream = StreamSupervisor(
            "keepalive", LEASE_KEEPALIVE, pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse,
            pool=pool, auth=auth, clock=clock, log=log, session=self._session,
            active=lambda: bool(self._leases), on_denied=self._denied, on_end=lambda: None)

    # -- membership --------------------------------------------------------------------

    def add(self, lease_id: int, ttl: int, on_lost: LostCallback) -> LeaseKeepAlive:
        """Start renewing ``lease_id``; callable from any thread (the work happens on the control loop)."""
        handle = LeaseKeepAlive(self, lease_id, on_lost)
        if _loop.in_loop():
            self._register(handle, ttl)
        else:
            _loop.call_soon(self._register, handle, ttl)
        return handle

    def _register(self, handle: LeaseKeepAlive, ttl: int) -> None:
        lease_id = handle.lease_id
        if handle.cancelled:
            return
        if self._closed:
            handle._report(RegistryUnavailable(f"etcd lease keepalive {lease_id}: the client is closed"))
            return
        st = self._leases.get(lease_id)
        if st is None:
            st = self._leases[lease_id] = _Lease(lease_id, ttl, self.clock())
        st.handles.append(handle)
        self._ensure_running()
        self._wake.set()

    def remove(self, handle: LeaseKeepAlive) -> None:
        st = self._leases.get(handle.lease_id)
        if st is None or handle not in st.handles:
            return
        st.handles.remove(handle)
        if not st.handles:
            del self._leases[handle.lease_id]

    def _lose(self, st: _Lease, reason: BaseException) -> None:
        if self._leases.get(st.lease_id) is st:
            del self._leases[st.lease_id]
        log.warning("etcd lease %d lost: %s", st.lease_id, reason)
        for h in list(st.handles):
            h._report(reason)

    def _ensure_running(self) -> None:
        self.stream.ensure_running()
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._expiry_loop(),
                                                                    name="waypost-etcd-lease-expiry")

    def _denied(self, e: PermissionDenied) -> None:
        """The credentials were refused: no lease can be renewed."""
        for st in list(self._leases.values()):
            self._lose(st, PermissionDenied(str(e)))

    # -- expiry --------------------------------------------------------------------------

    def check_expired(self) -> None:
        """Report every lease whose TTL ran out since its last successful renewal."""
        now = self.clock()
        for st in list(self._leases.values()):
            if now >= st.expires:
                self._lose(st, RegistryUnavailable(
                    f"etcd lease {st.lease_id} could not be renewed within its TTL of {st.ttl}s"))

    async def _expiry_loop(self) -> None:
        while not self._closed and self._leases:
            self.check_expired()
            if not self._leases:
                break
            nearest = min(st.expires for st in self._leases.values()) - self.clock()
            await asyncio.sleep(min(max(nearest, 0.01), 0.25))

    # -- the stream ----------------------------------------------------------------------

    async def _session(self, ep: Endpoint, call: grpc.aio.StreamStreamCall, md: Metadata) -> None:
        reader = asyncio.get_running_loop().create_task(self._read(call))
        for st in self._leases.values():
            st.sent.clear()  # answers to requests on the old stream will never come
            st.next_send = min(st.next_send, self.clock())
        try:
            while not self._closed and self._leases:
                if reader.done():
                    reader.result()
                    return
                now = self.clock()
                for st in list(self._leases.values()):
                    if now >= st.next_send:
                        await call.write(pb.LeaseKeepAliveRequest(ID=st.lease_id))
                        st.sent.append(now)
                        st.next_send = now + st.interval
                # no await from here on: the reader may not empty a ``sent`` queue under our feet
                wait = min((st.next_send for st in self._leases.values()), default=now + 1.0) - now
                # the lease whose unanswered renewal is nearest its limit
                limit, stalled = min(((st.stall_at(), st) for st in self._leases.values() if st.sent),
                                     key=lambda pair: pair[0], default=(0.0, None))
                if stalled is not None:
                    if now >= limit:
                        self.pool.mark_failed(ep)
                        raise Restart(f"no keepalive answer from {ep.address} for {now - stalled.sent[0]:.1f}s "
                                      f"and lease {stalled.lease_id} ends in {stalled.expires - now:.1f}s")
                    wait = min(wait, limit - now + 0.01)
                self._wake.clear()
                waker = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({reader, waker}, timeout=max(wait, 0.005),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waker.cancel()
        finally:
            _loop.abandon(reader)  # retrieved, even when it fails while cancelled: the writer's error is reported

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                raise RegistryUnavailable("etcd closed the keepalive stream")
            assert isinstance(resp, pb.LeaseKeepAliveResponse)
            st = self._leases.get(resp.ID)
            if st is None:
                continue
            sent_at = st.sent.popleft() if st.sent else self.clock()
            if resp.TTL <= 0:
                self._lose(st, LeaseNotFound(f"etcd lease {resp.ID} not found (expired or revoked)"))
                continue
            now = self.clock()
            st.expires = max(st.expires, sent_at + resp.TTL)
            st.next_send = min(st.next_send, now + max(resp.TTL / 3.0, 0.1))
            st.renewed += 1

    async def close(self) -> None:
        self._closed = True
        self._leases.clear()
        await self.stream.close()
        t = self._watchdog
        if t is not None and not t.done():
            t.cancel()
            await reap(t, log)
