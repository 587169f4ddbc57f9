"""Watches: many watchers multiplexed on ONE bidirectional Watch stream per client.

etcd 3.5 creates the watches of a stream one at a time, so the next create request is sent only
after the previous one was answered (``created``). Events are routed by watch id. After a
reconnect every watcher is created again from the revision after the last event it received (or
its start revision if it received none), so no event is missed or repeated. A start revision that
was compacted ends the iteration with ``Compacted(compact_revision)``; a watch canceled for any
other reason ends it with ``PermissionDenied`` or ``RegistryError`` -- never a silent dead watch.
The stream asks for a leader (``hasleader`` metadata), so a member cut off from the cluster ends
the stream and the watchers move to another member.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from typing import Any

import grpc
import grpc.aio

from .. import _loop, metrics
from ..errors import Compacted, PermissionDenied, RegistryError, RegistryUnavailable, StoreReset
from . import _errors, records
from ._generated import waypost_etcd_pb2 as pb
from ._methods import RANGE, WATCH
from .auth import Auth, Metadata
from .endpoints import Endpoint, EndpointPool
from .stream import Restart, StreamOwner, StreamSupervisor

log = logging.getLogger("waypost.etcd.watch")

_END = object()


class _Serialized:
    """Range answers stay serialized, as the client's own Range calls on the same endpoint get them
    (one method, one deserializer per channel): parsed here with ``records.parse``."""

    @staticmethod
    def FromString(data: bytes) -> bytes:
        return data


_order = itertools.count()


class Watcher:
    """One watch: an async iterator of event batches, one batch per revision, in order.

    Batches are lists of ``convert(event)`` (the raw ``Event`` messages without a converter).
    """

    def __init__(self, manager: WatchManager, key: bytes, range_end: bytes, start_revision: int,
                 prev_kv: bool, progress_notify: bool, convert: Callable[[Any], Any] | None) -> None:
        self._manager = manager
        self.key = key
        self.range_end = range_end
        self.start_revision = start_revision
        self.prev_kv = prev_kv
        self.progress_notify = progress_notify
        self._convert = convert
        self.order = next(_order)
        #: the revision to resume from: 0 until the first ``created`` when watching "from now"
        self.next_rev = start_revision
        self._revision = start_revision - 1 if start_revision > 0 else 0
        self._queue: collections.deque[Any] = collections.deque()
        self._ready: asyncio.Event | None = None
        self.watch_id: int | None = None
        self.cancelled = False
        self.failed: BaseException | None = None
        self._fragments: list[pb.Event] = []
        self.auth_retried = False

    # -- consumer side ---------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[list[Any]]:
        return self

    async def __anext__(self) -> list[Any]:
        while True:
            if self._queue:
                item = self._queue.popleft()
                if item is _END:
                    self._queue.appendleft(_END)
                    raise StopAsyncIteration
                if isinstance(item, BaseException):
                    self._queue.appendleft(_END)
                    raise item
                rev, batch = item
                self._revision = rev
                return batch  # type: ignore[no-any-return]
            if self.cancelled:
                raise StopAsyncIteration
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            await self._ready.wait()

    def cancel(self) -> None:
        """Stop watching; pending and future iteration ends (StopAsyncIteration)."""
        if self.cancelled:
            return
        self.cancelled = True
        if _loop.in_loop():
            self._manager.cancel(self)
        else:
            _loop.call_soon(self._manager.cancel, self)

    @property
    def revision(self) -> int:
        """The revision of the last batch handed out (start_revision - 1 before any)."""
        return self._revision

    @property
    def connected(self) -> bool:
        """True while the watch is established on a live stream (False while reconnecting)."""
        return self._manager.connected and self.watch_id is not None

    def __repr__(self) -> str:
        return f"<Watcher {self.key!r} next_rev={self.next_rev} id={self.watch_id}>"

    # -- manager side --------------------------------------------------------------------

    def _wake(self) -> None:
        if self._ready is not None:
            self._ready.set()

    def _push(self, item: Any) -> None:
        self._queue.append(item)
        self._wake()

    def _end(self, reason: BaseException | None) -> None:
        if reason is not None:
            self.failed = reason
            self._push(reason)
        else:
            self._queue.clear()
            self._push(_END)

    def _deliver(self, events: list[pb.Event]) -> None:
        batch: list[Any] = []
        rev = 0
        conv = self._convert
        last = self.next_rev - 1  # the newest revision already queued (or start_revision - 1)
        for ev in events:
            mod = ev.kv.mod_revision
            if mod < last:
                continue  # older than what was already queued: a repeat, never delivered twice
            if batch and mod != rev:
                self._queue_batch(rev, batch)
                batch = []
            rev = mod
            batch.append(conv(ev) if conv is not None else ev)
        if batch:
            self._queue_batch(rev, batch)
        if rev:
            self.next_rev = max(self.next_rev, rev + 1)
            self._wake()

    def _queue_batch(self, rev: int, batch: list[Any]) -> None:
        # etcd never splits a revision across responses (unfragmented), but if it did, keep one batch
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, tuple) and tail[0] == rev:
            tail[1].extend(batch)
        else:
            self._queue.append((rev, batch))

    def create_request(self, watch_id: int) -> pb.WatchRequest:
        return pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=self.key, range_end=self.range_end, start_revision=max(self.next_rev, 0),
            progress_notify=self.progress_notify, prev_kv=self.prev_kv, watch_id=watch_id,
        ))


class WatchManager(StreamOwner):
    """Runs the shared watch stream of one client (on the control loop)."""

    def __init__(self, pool: EndpointPool, auth: Auth, clock: Callable[[], float],
                 read_header: Callable[[bytes], Awaitable[pb.ResponseHeader]]) -> None:
        self.pool = pool
        self.auth = auth
        #: a linearizable read's header (revision, cluster id): confirms a revision that went back
        self._read_header = read_header
        #: the newest store revision seen by this client (watch streams and writes), and the cluster id
        self._store_rev = 0
        self._cluster_id = 0
        #: the newest record seen put (key, mod_revision, hash of the value): this store's history
        self._record: tuple[bytes, int, int] | None = None
        #: stores found to have gone back in time, for tests and diagnostics
        self.resets = 0
        self._watchers: dict[Watcher, None] = {}  # insertion-ordered set
        self._by_id: dict[int, Watcher] = {}
        self._to_create: collections.deque[Watcher] = collections.deque()
        self._creating: Watcher | None = None
        self._next_id = 0
        self._outbox: asyncio.Queue[pb.WatchRequest] | None = None
        self._closed = False
        self.stream = StreamSupervisor(
            "watch", WATCH, pb.WatchRequest, pb.WatchResponse, pool=pool, auth=auth, clock=clock, log=log,
            session=self._session, active=lambda: bool(self._watchers), on_denied=self._denied,
            on_end=self._stream_ended)
        self._session_ep: Endpoint | None = None
        self._session_call: grpc.aio.StreamStreamCall | None = None
        #: why the session's call was cancelled from outside (the session ends with it)
        self._restart: Restart | None = None
        pool.failure_listeners.append(self._endpoint_failed)

    def _endpoint_failed(self, ep: Endpoint) -> None:
        """Another call found our stream's member broken: move the stream now instead of waiting
        for gRPC keepalive to notice (the resume makes the move lossless)."""
        if ep is self._session_ep and len(self.pool.endpoints) > 1:
            self._cut_session(Restart(f"a call on {ep.address} failed; moving the watch stream", immediate=True))

    def _cut_session(self, why: Restart) -> None:
        """End the current stream (its session raises ``why``) and let the supervisor open another."""
        call = self._session_call
        if call is not None and self._restart is None:
            self._restart = why
            call.cancel()

    def add(self, key: bytes, range_end: bytes, *, start_revision: int, prev_kv: bool,
            progress_notify: bool, convert: Callable[[Any], Any] | None) -> Watcher:
        w = Watcher(self, key, range_end, start_revision, prev_kv, progress_notify, convert)
        if self._closed:
            w.cancelled = True
            w._end(None)
            return w
        if _loop.in_loop():
            self._attach(w)
        else:
            _loop.call_soon(self._attach, w)
        return w

    def _attach(self, w: Watcher) -> None:
        if w.cancelled or self._closed:
            return
        self._watchers[w] = None
        if not self.stream.running:
            self.stream.ensure_running()
        elif self.connected:
            self._to_create.append(w)
            self._pump()

    def cancel(self, w: Watcher) -> None:
        w.cancelled = True
        w._end(None)
        self._watchers.pop(w, None)
        with suppress(ValueError):
            self._to_create.remove(w)
        if w.watch_id is not None and self._by_id.get(w.watch_id) is w:
            del self._by_id[w.watch_id]
            self._send(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=w.watch_id)))
        w.watch_id = None

    def _fail(self, w: Watcher, reason: BaseException) -> None:
        log.warning("etcd watch on %r ended: %s", w.key, reason)
        self._watchers.pop(w, None)
        w.watch_id = None
        w._end(reason)

    def _send(self, req: pb.WatchRequest) -> None:
        if self._outbox is not None and self.connected:
            self._outbox.put_nowait(req)

    def _pump(self) -> None:
        """Send the next create request if none is awaiting its ``created`` answer."""
        while self._creating is None and self._to_create:
            w = self._to_create.popleft()
            if w.cancelled or w not in self._watchers:
                continue
            self._creating = w
            # our own nonzero ids: etcd 3.5 answers a refused create with the requested id, and
            # with the default 0 that answer would unregister the stream's first watch (id 0)
            self._next_id += 1
            self._send(w.create_request(self._next_id))

    # -- the stream --------------------------------------------------------------------

    def _denied(self, e: PermissionDenied) -> None:
        """The credentials were refused: every watcher fails, none dies silently."""
        for w in list(self._watchers):
            self._fail(w, PermissionDenied(str(e)))

    def _stream_ended(self) -> None:
        self._outbox = None
        self._creating = None
        self._by_id.clear()
        for w in self._watchers:
            w.watch_id = None
            w._fragments = []

    async def _session(self, ep: Endpoint, call: grpc.aio.StreamStreamCall, md: Metadata) -> None:
        self._session_ep, self._session_call, self._restart = ep, call, None
        outbox: asyncio.Queue[pb.WatchRequest] = asyncio.Queue()
        self._outbox = outbox
        self._by_id.clear()
        self._creating = None
        self._next_id = 0
        self._to_create = collections.deque(sorted(self._watchers, key=lambda w: w.order))
        writer = asyncio.get_running_loop().create_task(self._write(call, outbox))
        self._pump()
        checked = False
        try:
            while True:
                try:
                    resp = await call.read()
                except asyncio.CancelledError:
                    if self._restart is not None and not self._closed:
                        raise self._restart from None
                    raise
                if resp is grpc.aio.EOF:
                    raise RegistryUnavailable(f"etcd {ep.address} closed the watch stream")
                assert isinstance(resp, pb.WatchResponse)
                if not checked:  # a new stream: is this still the store the watchers were following?
                    checked = True
                    await self._check_store(resp.header, ep)
                elif resp.header.revision > self._store_rev:
                    self._store_rev = resp.header.revision
                self._handle(resp, md)
                if writer.done():
                    writer.result()
                if self._closed or not self._watchers:
                    return
        finally:
            self._session_ep = self._session_call = None
            _loop.abandon(writer)  # (a write that failed after the read did is no news either)

    async def _write(self, call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue[pb.WatchRequest]) -> None:
        while True:
            req = await outbox.get()
            await call.write(req)

    # -- a store that went back in time ------------------------------------------------------

    def note_revision(self, revision: int) -> None:
        """The client saw the store at ``revision`` (an answer to a read or a write): a later stream
        must not be below. Every revision a member answers with was committed, so the newest one
        seen is a floor for any linearizable answer that comes later."""
        self._store_rev = max(self._store_rev, revision)

    @property
    def record_revision(self) -> int:
        """The mod_revision of the newest record noted with ``note_record`` (0: none)."""
        return self._record[1] if self._record is not None else 0

    def note_record(self, key: bytes, mod_revision: int, value: bytes) -> None:
        """The client saw ``key`` put at ``mod_revision`` with ``value`` (an event, a read). The newest
        such record is checked on each new stream: an emptied store that other clients wrote up to
        the same revision meanwhile holds another record there (or none) at that revision."""
        if mod_revision > self.record_revision:
            self._record = (key, mod_revision, hash(value))
        self.note_revision(mod_revision)

    def write_floor(self) -> tuple[int, int]:
        """Taken before sending a write, handed to ``note_write`` with its answer."""
        return self._store_rev, self.resets

    def note_write(self, revision: int, floor: tuple[int, int]) -> None:
        """A write sent at ``floor`` (``write_floor()``) was answered at ``revision``.

        etcd applies a write after everything committed before it was sent, so its answer is never
        below a revision the client had seen by then -- unless the store went back in time. That
        answer is the one certain sign when this client itself writes to the new store (a publisher
        registering again, a put): those writes would otherwise raise the newest revision seen to
        the new store's, and a watch stream coming back after them would find nothing amiss while
        its watchers wait for revisions the new store reaches much later.
        """
        seen, resets = floor
        if 0 < revision < seen and resets == self.resets:  # (a reset since the send: already handled)
            if self._reset(revision, f"a write sent after revision {seen} was answered at {revision}"):
                self._cut_session(Restart("the store went back in time", immediate=True, outage=False))
            return
        self.note_revision(revision)

    async def _check_store(self, header: pb.ResponseHeader, ep: Endpoint) -> None:
        """Fail every positioned watcher with ``StoreReset`` if the store went back in time.

        Resuming at the last revision + 1 on an etcd that was emptied or restored from a backup would
        wait, silently, for a revision the new store reaches only much later (and never report the
        keys that vanished). Signs, checked on the first answer of each new stream: another cluster
        id (the id derives from the member set), or a revision below the newest one this client saw
        (on its watch streams, in the answers to its reads -- a subscriber's position comes from one,
        and its first stream may die before answering -- or to its writes; a write answered below
        what was seen before it was sent is itself a sign: ``note_write``). A new store that has
        already passed that revision when the stream comes back, without this client writing to it,
        cannot be told apart this way. A member that is merely behind also answers with an older
        revision, so that sign is confirmed by a linearizable read, which no member answers before
        it caught up with the leader.
        """
        rev, cid = header.revision, header.cluster_id
        reason = ""
        if self._cluster_id and cid and cid != self._cluster_id:
            reason = f"cluster id {self._cluster_id:x} is now {cid:x}"
        elif rev < self._store_rev:
            key = next(iter(self._watchers)).key if self._watchers else b"\0"
            seen, resets = self._store_rev, self.resets
            try:
                confirmed = await self._read_header(key)
            except RegistryError as e:  # unknown: check again on the next stream
                raise Restart(f"{ep.address} answered at revision {rev} < {seen} and a read to "
                              f"confirm failed ({e})") from None
            rev = confirmed.revision
            # against the floor from before the read (answers that came meanwhile may have raised it),
            # unless a write's answer found the reset meanwhile
            if rev < seen and resets == self.resets:
                reason = f"revision {seen} is now {rev}"
            elif resets == self.resets:
                # the store reached the revision seen between the two answers: writes to an emptied store
                # (another client's) can do that, so the records decide, as below
                reason = await self._check_record(ep)
        else:
            reason = await self._check_record(ep)
        self._cluster_id = cid or self._cluster_id
        if not reason:
            self._store_rev = max(self._store_rev, rev)
            return
        if self._reset(rev, reason):  # their watches on the server wait for revisions that may never come
            raise Restart("the store went back in time", immediate=True, outage=False)

    async def _check_record(self, ep: Endpoint) -> str:
        """Read the newest record this client saw, at its revision: why the store is not the one the
        watchers followed, or "" when it holds that record as it was (or cannot tell: compacted).

        A store at or past the newest revision the client saw may still be another one: emptied,
        then written up to that revision by other clients before this stream came back. The same
        store answers this read with the very record (its history at that revision never changes);
        another one with another value, another key or none. Only when some watcher has a position
        to resume from: a watch from "now" has no history to lose.
        """
        record = self._record
        if record is None or not any(w.next_rev > 0 for w in self._watchers):
            return ""
        key, mod, digest = record
        resets = self.resets
        # with a leader only, and briefly: a member cut off from the majority answers "no leader" at once
        # instead of holding the new stream for etcd's own request timeout (the check is retried on the next one)
        md = await self.auth.metadata(ep, require_leader=True)
        try:
            data = await ep.unary(RANGE, pb.RangeRequest, _Serialized)(
                pb.RangeRequest(key=key, revision=mod, limit=1), metadata=md,
                timeout=min(self.pool.cfg.request_timeout, 2.0))
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.OUT_OF_RANGE and not _errors.is_compacted(e):
                # "a future revision", from a linearizable read: the store is behind what was seen
                return f"revision {mod} is in the future of this store"
            if e.code() in _errors.UNAVAILABLE_CODES:  # unknown: check again on the next stream
                raise Restart(f"{ep.address}: reading {key!r} at revision {mod} to check the store failed "
                              f"({e.code().name} {_errors.details(e)})") from None
            # compacted past it (the store moved on, which an emptied one rarely did), or refused
            # (the role changed): cannot tell, and the watchers must not wait on it
            log.debug("etcd watch: reading %r at revision %d to check the store: %s %s", key, mod,
                      e.code().name, _errors.details(e))
            return ""
        if resets != self.resets:
            return ""  # a write's answer found a reset meanwhile: handled there
        resp = records.parse(pb.RangeResponse, data)
        kv = resp.kvs[0] if resp.kvs else None
        if kv is not None and kv.mod_revision == mod and hash(kv.value) == digest:
            return ""
        return f"{key!r} put at revision {mod} is not there any more"

    def _reset(self, rev: int, reason: str) -> int:
        """The store went back in time to ``rev``: warn once, count it, and end every positioned
        watcher with ``StoreReset``. Returns how many were ended (their stream must be dropped)."""
        self._store_rev = rev
        self._record = None  # the old store's
        self.resets += 1
        positioned = [w for w in self._watchers if w.next_rev > 0]
        log.warning("etcd store went back in time (%s): restored from a backup or restarted with an empty "
                    "data directory; %d watches start over", reason, len(positioned))
        obs = metrics.current
        if obs is not None:
            obs.store_reset()
        for w in positioned:
            self._watchers.pop(w, None)
            w.watch_id = None
            w._end(StoreReset(rev, f"etcd watch on {w.key!r}: the store went back in time ({reason})"))
        return len(positioned)

    def _handle(self, resp: pb.WatchResponse, md: Metadata) -> None:
        if resp.created:
            w = self._creating
            self._creating = None
            if w is None:
                log.warning("etcd watch: unexpected 'created' answer (watch id %d)", resp.watch_id)
            elif resp.canceled or resp.watch_id < 0:
                self._create_refused(w, resp, md)
            else:
                w.watch_id = resp.watch_id
                w.auth_retried = False
                self._by_id[resp.watch_id] = w
                if w.next_rev <= 0:
                    w.next_rev = resp.header.revision + 1
                    w._revision = resp.header.revision
                if w.cancelled:
                    self.cancel(w)
            self._pump()
            return
        w = self._by_id.get(resp.watch_id)
        if resp.canceled:
            if w is not None:
                del self._by_id[resp.watch_id]
                self._canceled(w, resp)
            return
        if w is None:
            return  # a watcher we already canceled, or a stream-wide progress answer
        if resp.fragment:
            w._fragments.extend(resp.events)
            return
        events: list[pb.Event] = list(resp.events)
        if w._fragments:
            events = w._fragments + events
            w._fragments = []
        if events:
            for ev in reversed(events):  # (in revision order: the last put is the newest)
                if ev.type == pb.Event.PUT:
                    self.note_record(ev.kv.key, ev.kv.mod_revision, ev.kv.value)
                    break
            w._deliver(events)
        elif w.progress_notify and resp.header.revision >= w.next_rev:
            # progress: every event up to this revision has been sent
            w.next_rev = resp.header.revision + 1

    def _create_refused(self, w: Watcher, resp: pb.WatchResponse, md: Metadata) -> None:
        reason = resp.cancel_reason
        if resp.compact_revision:
            self._fail(w, Compacted(resp.compact_revision))
            return
        auth_like = "permission denied" in reason or _errors.is_auth_reason(reason)
        if auth_like and self.auth.enabled and not w.auth_retried:
            # etcd answers a stale token (e.g. after a restart) with "permission denied": new token, new stream
            w.auth_retried = True
            self.auth.invalidate_sent(md)
            raise Restart(f"watch on {w.key!r} refused ({reason}); authenticating again", immediate=True)
        exc: RegistryError = (PermissionDenied if auth_like else RegistryError)(
            f"etcd watch on {w.key!r} refused: {reason or 'canceled by the server'}")
        self._fail(w, exc)

    def _canceled(self, w: Watcher, resp: pb.WatchResponse) -> None:
        if w.cancelled:
            return
        if resp.compact_revision:
            self._fail(w, Compacted(resp.compact_revision))
            return
        reason = resp.cancel_reason or "canceled by the server"
        cls = PermissionDenied if "permission denied" in reason else RegistryError
        self._fail(w, cls(f"etcd watch on {w.key!r} canceled: {reason}"))

    async def close(self) -> None:
        self._closed = True
        for w in list(self._watchers):
            w.cancelled = True
            w._end(None)
        self._watchers.clear()
        await self.stream.close()
