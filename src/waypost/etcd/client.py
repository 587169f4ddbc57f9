"""waypost's etcd v3 client on grpc.aio: KV, leases, watches, auth and endpoint failover.

Everything runs on the control-plane loop (``waypost._loop``). Requests and responses are the
generated message classes of our proto subset; the method paths are etcd's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

from .. import _fork
from ..errors import Compacted, PermissionDenied, RegistryUnavailable
from . import _errors, records
from ._methods import (
    AUTHENTICATE,
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
from ._proto import waypost_etcd_pb2 as pb
from .config import EtcdConfig
from .endpoints import Endpoint, EndpointPool

log = logging.getLogger("waypost.etcd")

M = TypeVar("M")


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
        from .lease import KeepAliveManager
        from .watch import WatchManager

        self.cfg = cfg
        self.clock = clock
        self.pool = EndpointPool(cfg, clock)
        self._token: str | None = None
        self._auth_disabled = False
        self._auth_lock = asyncio.Lock()
        self._closed = False
        self.leases = KeepAliveManager(self)
        self.watches = WatchManager(self)
        _fork.register(self)

    def __repr__(self) -> str:
        user = f" user={self.cfg.username!r}" if self.cfg.username else ""
        return f"<EtcdClient {','.join(self.cfg.endpoints)}{user}>"

    # -- auth ------------------------------------------------------------------------------

    async def token(self, ep: Endpoint | None = None) -> str | None:
        """The auth token to send (authenticating first if needed), or None without auth."""
        if not self.cfg.username or self._auth_disabled:
            return None
        tok = self._token
        if tok is not None:
            return tok
        async with self._auth_lock:
            if self._token is None and not self._auth_disabled:
                await self._authenticate(ep)
            return self._token

    def invalidate_token(self, token: str | None) -> None:
        """Forget ``token`` (if still current) so the next call authenticates again."""
        if self._token == token:
            self._token = None
        self._auth_disabled = False

    async def _authenticate(self, ep: Endpoint | None) -> None:
        req = pb.AuthenticateRequest(name=self.cfg.username or "", password=self.cfg.password or "")
        start = self.clock()
        deadline = start + self.cfg.dial_timeout + self.cfg.request_timeout
        attempts = 0
        while True:
            if ep is None or attempts:
                ep = await self.pool.pick("authenticate", timeout=max(min(self.cfg.dial_timeout,
                                                                          deadline - self.clock()), 0.001))
            attempts += 1
            try:
                resp = await ep.unary(AUTHENTICATE, pb.AuthenticateRequest, pb.AuthenticateResponse)(
                    req, timeout=max(deadline - self.clock(), 0.05),
                )
            except grpc.aio.AioRpcError as e:
                d = _errors.details(e)
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in d:
                    log.debug("etcd auth is not enabled; sending no token")
                    self._auth_disabled = True
                    return
                if e.code() in _errors.UNAVAILABLE_CODES:
                    self.pool.mark_failed(ep)
                    if attempts <= len(self.pool.endpoints) and self.clock() < deadline:
                        continue
                if "authentication failed" in d:
                    raise PermissionDenied(
                        f"etcd authenticate failed: wrong user name or password for user {self.cfg.username!r}"
                    ) from None
                raise _errors.map_error(e, "authenticate", ep.address) from None
            self.pool.mark_ok(ep)
            self._token = resp.token
            log.debug("authenticated to etcd as %r", self.cfg.username)
            return

    async def metadata(self, ep: Endpoint | None = None, *, require_leader: bool = False
                       ) -> tuple[tuple[str, str], ...] | None:
        """Call metadata: the auth token, and ``hasleader`` for streams that need a leader."""
        tok = await self.token(ep)
        md: list[tuple[str, str]] = []
        if tok:
            md.append(("token", tok))
        if require_leader:
            md.append(("hasleader", "true"))
        return tuple(md) or None

    # -- unary calls ---------------------------------------------------------------------

    async def call(self, op: str, method: str, req: Any, resp_type: type[M], *,
                   idempotent: bool = True, timeout: float | None = None) -> M:
        """One unary call with deadline, failover, and a single re-authentication."""
        cfg = self.cfg
        n = len(self.pool.endpoints)
        budget = cfg.request_timeout if timeout is None else timeout
        per_attempt = budget if n == 1 else max(budget / 2, 1.0)
        deadline = self.clock() + cfg.dial_timeout + budget
        auth_retried = False
        attempts = 0
        last: grpc.aio.AioRpcError | None = None
        while True:
            if self._closed:
                raise self.pool._closed_error(op)
            left = deadline - self.clock()
            if left <= 0 or attempts > n + 1:
                if last is not None:
                    raise _errors.map_error(last, op, key=_errors.request_key(req)) from None
                raise RegistryUnavailable(f"etcd {op}: no answer within {budget:g}s")
            ep = self.pool.ready_now() or await self.pool.pick(op, timeout=min(cfg.dial_timeout, left))
            md = await self.metadata(ep)
            if ep.channel is None:  # paused for a fork meanwhile (waypost._fork): pick again
                continue
            attempts += 1
            generation = self.pool.generation
            try:
                resp = await ep.unary(method, type(req), resp_type)(
                    req, timeout=max(min(per_attempt, deadline - self.clock()), 0.05), metadata=md,
                )
            except asyncio.CancelledError:
                # a call cut by closing its channel for a fork ends "cancelled": retry it, unless this
                # task itself is being cancelled
                cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python >= 3.11
                if self.pool.generation == generation or (cancelling is not None and cancelling()):
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
                    self.invalidate_token(dict(md or ()).get("token"))
                    log.info("etcd %s: auth token rejected (%s); authenticating again", op, e.code().name)
                    continue
                if e.code() in _errors.UNAVAILABLE_CODES:
                    self.pool.mark_failed(ep)
                    # a deadline on the only endpoint would just repeat: give up at once
                    if idempotent and (n > 1 or e.code() == grpc.StatusCode.UNAVAILABLE):
                        continue
                if _errors.is_compacted(e):
                    rev = await self.compact_revision(getattr(req, "key", b"") or b"\0waypost/compact-probe")
                    raise Compacted(rev, f"etcd {op}: {_errors.details(e)} (compacted at {rev})") from None
                raise _errors.map_error(e, op, ep.address, key=_errors.request_key(req)) from None
            self.pool.mark_ok(ep)
            return resp  # type: ignore[no-any-return]

    async def compact_revision(self, key: bytes = b"\0waypost/compact-probe") -> int:
        """The store's compaction revision (0 if unknown), found with a watch on ``key`` from revision 1.

        Only used after etcd said "compacted", so revision 1 is gone and etcd answers the watch with
        the compaction revision instead of history. ``key`` should be one the caller may read.
        """
        try:
            ep = await self.pool.pick("compact revision")
            md = await self.metadata(ep)
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
            from ..errors import RegistryError

            raise RegistryError(f"etcd lease grant failed: {resp.error}")
        return resp

    async def lease_revoke(self, lease_id: int) -> pb.LeaseRevokeResponse:
        return await self.call("lease revoke", LEASE_REVOKE, pb.LeaseRevokeRequest(ID=lease_id),
                               pb.LeaseRevokeResponse)

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> pb.LeaseTimeToLiveResponse:
        return await self.call("lease time-to-live", LEASE_TTL, pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys),
                               pb.LeaseTimeToLiveResponse)

    def keep_alive(self, lease_id: int, ttl: int,
                   on_lost: Callable[[int, BaseException | None], None]) -> Any:
        """Renew ``lease_id`` every ttl/3 on the shared keepalive stream; see ``lease.KeepAliveManager``."""
        return self.leases.add(lease_id, ttl, on_lost)

    # -- watch ---------------------------------------------------------------------------

    def watch(self, key: bytes, range_end: bytes = b"", *, start_revision: int = 0, prev_kv: bool = False,
              progress_notify: bool = False, convert: Callable[[Any], Any] | None = None) -> Any:
        """A watcher on the shared watch stream; see ``watch.Watcher``."""
        return self.watches.add(key, range_end, start_revision=start_revision, prev_kv=prev_kv,
                                progress_notify=progress_notify, convert=convert)

    # -- misc ----------------------------------------------------------------------------

    async def status(self) -> pb.StatusResponse:
        """The status of the member the client currently talks to."""
        return await self.call("status", STATUS, pb.StatusRequest(), pb.StatusResponse)

    # -- fork (waypost._fork) -------------------------------------------------------------------

    async def suspend_for_fork(self) -> None:
        """Stop the watch and keepalive streams (as after a network cut), then close every channel."""
        for mgr in (self.watches, self.leases):
            t = mgr._task
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):  # it restarts after the fork
                    await t
        await self.pool.suspend_for_fork()

    def resume_after_fork(self) -> None:
        """New channels; the streams start again and resume (watches from their last revision)."""
        self.pool.resume_after_fork()
        if self._closed:
            return
        watches = self.watches
        if watches._watchers and (watches._task is None or watches._task.done()):
            watches._task = asyncio.get_running_loop().create_task(watches._run(), name="waypost-etcd-watch")
        if self.leases._leases:
            self.leases._ensure_running()

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
