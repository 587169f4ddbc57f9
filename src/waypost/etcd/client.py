"""waypost's etcd v3 client on grpc.aio: KV, leases, watches, auth and endpoint failover.

Everything runs on the control-plane loop (``waypost._loop``). Requests and responses are the
generated message classes of our proto subset; the method paths are etcd's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

from .. import _fork
from ..errors import Compacted, RegistryError, RegistryUnavailable
from . import _errors, records
from . import deadline as deadline_mod
from ._generated import waypost_etcd_pb2 as pb
from ._methods import (
    COMPACT,
    DELETE_RANGE,
    LEASE_GRANT,
    LEASE_REVOKE,
    LEASE_TTL,
    PUT,
    RANGE,
    STATUS,
    TXN,
    WATCH,
)
from .auth import Auth
from .config import EtcdConfig
from .endpoints import Endpoint, EndpointPool
from .lease import KeepAliveManager, LeaseKeepAlive, LostCallback
from .watch import Watcher, WatchManager

log = logging.getLogger("waypost.etcd")

M = TypeVar("M")

#: the shortest wait for one attempt when there are several endpoints (see ``EtcdClient.call``)
MIN_ATTEMPT = 1.0
#: an attempt its caller cancelled after waiting this long marks its member failed
SUSPECT_AFTER = 1.0
#: the pause when every member answered "no leader" (an election), doubling up to the maximum
NO_LEADER_BACKOFF = 0.05
MAX_NO_LEADER_BACKOFF = 0.5
#: a hard bound on the rounds of one call's loop (the deadline ends it long before)
MAX_ROUNDS = 10_000


class _Unparsed:
    """A response "type" whose deserializer keeps the bytes: Range is parsed by its caller (records.py)."""

    @staticmethod
    def FromString(data: bytes) -> bytes:
        return data


class EtcdClient:
    """A client for one etcd endpoint set. Create, use and close it on the control loop.

    Unary calls have a deadline and fail over between endpoints; errors are waypost exceptions
    (``RegistryUnavailable``, ``PermissionDenied``, ``LeaseNotFound``, ``Compacted``,
    ``RegistryError``) whose messages name the operation. Leases are kept alive on one shared
    stream (``keep_alive``) and watches share one stream (``watch``).
    """

    def __init__(self, cfg: EtcdConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.pool = EndpointPool(cfg, clock)
        self.auth = Auth(cfg, self.pool, clock)
        self._closed = False
        self.leases = KeepAliveManager(self.pool, self.auth, clock)
        self.watches = WatchManager(self.pool, self.auth, clock, self.read_header)
        _fork.register(self)

    def __repr__(self) -> str:
        user = f" user={self.cfg.username!r}" if self.cfg.username else ""
        return f"<EtcdClient {','.join(self.cfg.endpoints)}{user}>"

    # -- unary calls ---------------------------------------------------------------------

    async def call(self, op: str, method: str, req: Any, resp_type: type[M], *,
                   idempotent: bool = True, timeout: float | None = None) -> M:
        """One unary call with deadline, failover, and a single re-authentication.

        How long one attempt may wait on one member, and when another member is tried:

        - The call's budget is ``timeout`` (default: request_timeout), cut to the caller's own when one is set
          with ``deadline.within`` (a caller that gives up after 3 s cancels the call; waiting 5 s on one
          member would mean it never sees another). With several endpoints an attempt gets half of that
          budget (at least ``MIN_ATTEMPT``), so a failover always fits: a member that does not answer in
          time is marked failed and the next attempt goes to another one.
        - Requests that need a leader (all but serializable reads and Status) carry ``hasleader``, as
          etcd's clientv3 ``WithRequireLeader`` does: a member cut off from the majority answers at once
          ``no leader``, before handling the request, instead of holding it until a deadline. That answer
          is retried on the other members (transactions too: nothing was applied), with a short backoff
          while every member says it (an election), until the budget runs out.
        - An attempt its caller cancels after it waited ``SUSPECT_AFTER`` s marks its member failed too,
          so the caller's next try goes elsewhere even when no deadline of ours fired.
        - An idempotent call that failed on one member because of it (unreachable, a deadline, etcd's
          leader errors) is retried on another; a transaction only when it was never sent, else it raises
          ``RegistryUnavailable`` saying that it may have been applied.
        """
        cfg = self.cfg
        clock = self.clock
        n = len(self.pool.endpoints)
        budget = cfg.request_timeout if timeout is None else timeout
        deadline = clock() + cfg.dial_timeout + budget
        caller_left = deadline_mod.time_left()
        if caller_left is not None:
            budget = min(budget, max(caller_left, 0.0))
            deadline = min(deadline, clock() + caller_left)
        per_attempt = budget if n == 1 else max(budget / 2, MIN_ATTEMPT)
        need_leader = method != STATUS and not getattr(req, "serializable", False)
        auth_retried = False
        attempts = 0
        leaderless: set[Endpoint] = set()  # members that answered "no leader" to this call
        backoff = NO_LEADER_BACKOFF
        last: grpc.aio.AioRpcError | None = None
        for _ in range(MAX_ROUNDS):  # bounded by the deadline long before this
            if self._closed:
                raise self.pool.closed_error(op)
            left = deadline - clock()
            if left <= 0 or attempts > n + 1:
                break
            ep = self.pool.ready_now() or await self.pool.pick(op, timeout=min(cfg.dial_timeout, left))
            if ep in leaderless:
                other = self.pool.ready_other(leaderless)
                if other is None:
                    # every connected member said "no leader" (an election, or the others still connecting)
                    if len(leaderless) >= n:
                        leaderless.clear()
                    await asyncio.sleep(min(backoff, max(deadline - clock(), 0.0)))
                    backoff = min(backoff * 2, MAX_NO_LEADER_BACKOFF)
                    continue
                ep = other
            md = await self.auth.metadata(ep, require_leader=need_leader)
            if ep.channel is None:  # paused for a fork meanwhile (waypost._fork): pick again
                continue
            attempts += 1
            generation = self.pool.generation
            started = clock()
            try:
                resp = await ep.unary(method, type(req), resp_type)(
                    req, timeout=max(min(per_attempt, deadline - clock()), 0.05), metadata=md,
                )
            except asyncio.CancelledError:
                # a call cut by closing its channel for a fork ends "cancelled": retry it, unless this
                # task itself is being cancelled
                cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python >= 3.11
                if self.pool.generation == generation or (cancelling is not None and cancelling()):
                    if n > 1 and self.pool.generation == generation and clock() - started >= SUSPECT_AFTER:
                        log.info("etcd %s: no answer from %s within %.1fs, when its caller gave up", op,
                                 ep.address, clock() - started)
                        self.pool.mark_failed(ep, notify=False)
                    raise
                if not idempotent:
                    raise RegistryUnavailable(f"etcd {op}: interrupted by a fork of this process; "
                                              "it may or may not have been applied") from None
                attempts -= 1
                continue
            except grpc.aio.AioRpcError as e:
                if self.pool.generation != generation:  # cut by a fork pause, not by etcd
                    if not idempotent:
                        raise RegistryUnavailable(f"etcd {op}: interrupted by a fork of this process; "
                                                  "it may or may not have been applied") from None
                    attempts -= 1
                    continue
                last = e
                if self.cfg.username and not auth_retried and _errors.is_auth_retryable(e):
                    auth_retried = True
                    self.auth.invalidate_sent(md)
                    log.info("etcd %s: auth token rejected (%s); authenticating again", op, e.code().name)
                    continue
                if need_leader and _errors.is_no_leader(e):
                    # refused before it was handled: safe to send anywhere again, a transaction too
                    if not leaderless:
                        log.info("etcd %s: %s has no leader; trying the others", op, ep.address)
                    leaderless.add(ep)
                    self.pool.skip(ep)
                    attempts -= 1
                    continue
                if _errors.member_cannot_serve(e):
                    self.pool.mark_failed(ep)
                    # a deadline on the only endpoint would just repeat: give up at once
                    retry = n > 1 or e.code() == grpc.StatusCode.UNAVAILABLE
                    if retry and (idempotent or _errors.never_sent(e)):
                        continue
                    if not idempotent:
                        raise RegistryUnavailable(
                            f"{_errors.map_error(e, op, ep.address, key=_errors.request_key(req))}; not retried "
                            "on another member: it may or may not have been applied") from None
                if _errors.is_compacted(e):
                    rev = await self.compact_revision(getattr(req, "key", b"") or b"\0waypost/compact-probe")
                    raise Compacted(rev, f"etcd {op}: {_errors.details(e)} (compacted at {rev})") from None
                raise _errors.map_error(e, op, ep.address, key=_errors.request_key(req)) from None
            self.pool.mark_ok(ep)
            header = getattr(resp, "header", None)  # None for a Range kept serialized
            if header is not None:
                self.watches.note_revision(header.revision)
            return resp  # type: ignore[no-any-return]
        if last is not None:
            raise _errors.map_error(last, op, key=_errors.request_key(req)) from None
        raise RegistryUnavailable(f"etcd {op}: no answer within {budget:g}s")

    async def compact_revision(self, key: bytes = b"\0waypost/compact-probe") -> int:
        """The store's compaction revision (0 if unknown), found with a watch on ``key`` from revision 1.

        Only used after etcd said "compacted", so revision 1 is gone and etcd answers the watch with
        the compaction revision instead of history. ``key`` should be one the caller may read.
        """
        try:
            ep = await self.pool.pick("compact revision")
            md = await self.auth.metadata(ep)
            stream = ep.stream(WATCH, pb.WatchRequest, pb.WatchResponse)(metadata=md)
            try:
                # the answer is "created", then "canceled" with compact_revision
                await stream.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                    key=key, start_revision=1, watch_id=1)))
                for _ in range(4):
                    resp = await asyncio.wait_for(stream.read(), min(self.cfg.request_timeout, 2.0))
                    if not isinstance(resp, pb.WatchResponse):
                        break
                    if resp.compact_revision:
                        return int(resp.compact_revision)
                    if resp.canceled:
                        break
            finally:
                stream.cancel()
        except Exception:
            log.debug("could not learn the compaction revision", exc_info=True)
        return 0

    # -- KV ----------------------------------------------------------------------------------

    async def range(self, key: bytes, range_end: bytes = b"", *, revision: int = 0, limit: int = 0,
                    keys_only: bool = False, count_only: bool = False, serializable: bool = False,
                    timeout: float | None = None) -> pb.RangeResponse:
        """Range [key, range_end) (only ``key`` when range_end is empty), sorted by key."""
        data = await self.range_serialized(key, range_end, revision=revision, limit=limit, keys_only=keys_only,
                                           count_only=count_only, serializable=serializable, timeout=timeout)
        return records.parse(pb.RangeResponse, data)

    async def range_serialized(self, key: bytes, range_end: bytes = b"", *, revision: int = 0, limit: int = 0,
                               keys_only: bool = False, count_only: bool = False, serializable: bool = False,
                               timeout: float | None = None) -> bytes:
        """``range`` answered as the serialized RangeResponse, for a caller that reads the records its
        own way (``records.head``/``records.columns``: the registry's fast path)."""
        req = pb.RangeRequest(key=key, range_end=range_end, revision=revision, limit=limit,
                              keys_only=keys_only, count_only=count_only, serializable=serializable)
        return cast(bytes, await self.call("get", RANGE, req, _Unparsed, timeout=timeout))

    async def read_header(self, key: bytes) -> pb.ResponseHeader:
        """The header of a linearizable count of ``key``: the store's current revision and cluster id."""
        return (await self.range(key, count_only=True)).header

    async def put(self, key: bytes, value: bytes, *, lease: int = 0, prev_kv: bool = False,
                  timeout: float | None = None) -> pb.PutResponse:
        req = pb.PutRequest(key=key, value=value, lease=lease, prev_kv=prev_kv)
        return await self.call("put", PUT, req, pb.PutResponse, timeout=timeout)

    async def delete_range(self, key: bytes, range_end: bytes = b"", *, prev_kv: bool = False,
                           timeout: float | None = None) -> pb.DeleteRangeResponse:
        req = pb.DeleteRangeRequest(key=key, range_end=range_end, prev_kv=prev_kv)
        return await self.call("delete", DELETE_RANGE, req, pb.DeleteRangeResponse, timeout=timeout)

    async def txn(self, compare: Sequence[pb.Compare], success: Sequence[pb.RequestOp] = (),
                  failure: Sequence[pb.RequestOp] = (), *, timeout: float | None = None) -> pb.TxnResponse:
        """A transaction. Not retried after it may have reached the server (not idempotent)."""
        req = pb.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        return await self.call("txn", TXN, req, pb.TxnResponse, idempotent=False, timeout=timeout)

    async def put_if_absent(self, key: bytes, value: bytes, *, lease: int = 0) -> pb.TxnResponse:
        """Put ``key`` only if it does not exist (create_revision == 0); ``succeeded`` tells."""
        cmp = pb.Compare(key=key, target=pb.Compare.CREATE, result=pb.Compare.EQUAL, create_revision=0)
        op = pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))
        return await self.txn([cmp], [op])

    async def compact(self, revision: int, *, physical: bool = False) -> pb.CompactionResponse:
        req = pb.CompactionRequest(revision=revision, physical=physical)
        return await self.call("compact", COMPACT, req, pb.CompactionResponse)

    # -- leases --------------------------------------------------------------------------

    async def lease_grant(self, ttl: int, lease_id: int = 0) -> pb.LeaseGrantResponse:
        req = pb.LeaseGrantRequest(TTL=ttl, ID=lease_id)
        resp = await self.call("lease grant", LEASE_GRANT, req, pb.LeaseGrantResponse)
        if resp.error:
            raise RegistryError(f"etcd lease grant failed: {resp.error}")
        return resp

    async def lease_revoke(self, lease_id: int) -> pb.LeaseRevokeResponse:
        return await self.call("lease revoke", LEASE_REVOKE, pb.LeaseRevokeRequest(ID=lease_id),
                               pb.LeaseRevokeResponse)

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> pb.LeaseTimeToLiveResponse:
        return await self.call("lease time-to-live", LEASE_TTL, pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys),
                               pb.LeaseTimeToLiveResponse)

    def keep_alive(self, lease_id: int, ttl: int, on_lost: LostCallback) -> LeaseKeepAlive:
        """Renew ``lease_id`` every ttl/3 on the shared keepalive stream; see ``lease.KeepAliveManager``."""
        # the stream and its watchdog outlive the caller: they must not inherit its deadline
        return deadline_mod.detached().run(self.leases.add, lease_id, ttl, on_lost)

    # -- watch ---------------------------------------------------------------------------

    def watch(self, key: bytes, range_end: bytes = b"", *, start_revision: int = 0, prev_kv: bool = False,
              progress_notify: bool = False, convert: Callable[[Any], Any] | None = None) -> Watcher:
        """A watcher on the shared watch stream; see ``watch.Watcher``."""
        return deadline_mod.detached().run(self.watches.add, key, range_end, start_revision=start_revision,
                                           prev_kv=prev_kv, progress_notify=progress_notify, convert=convert)

    # -- misc ----------------------------------------------------------------------------

    async def status(self) -> pb.StatusResponse:
        """The status of the member the client currently talks to."""
        return await self.call("status", STATUS, pb.StatusRequest(), pb.StatusResponse)

    # -- fork (waypost._fork) -------------------------------------------------------------------

    async def suspend_for_fork(self) -> None:
        """Stop the watch and keepalive streams (as after a network cut), then close every channel."""
        await self.watches.stream.suspend()
        await self.leases.stream.suspend()
        await self.pool.suspend_for_fork()

    def resume_after_fork(self) -> None:
        """New channels; the streams start again and resume (watches from their last revision)."""
        self.pool.resume_after_fork()
        if self._closed:
            return
        self.watches.stream.resume()
        self.leases.stream.resume()  # the lease expiry watchdog was never stopped

    def abandon_after_fork(self) -> None:
        """In a child: this client belongs to the parent and never touches grpc again."""
        self._closed = True
        self.pool.abandon_after_fork()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop keepalives and watches (watchers end) and close the channels."""
        if self._closed:
            return
        self._closed = True
        await self.leases.close()
        await self.watches.close()
        await self.pool.close()
