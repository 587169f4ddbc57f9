"""The auth token of one etcd client: obtained once, shared by every call and stream, renewed on demand.

Kept apart from the client so the long-lived streams (keepalive, watch) can send the token and drop a
rejected one without knowing the client that owns them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
import grpc.aio

from ..errors import PermissionDenied
from . import _errors
from ._generated import waypost_etcd_pb2 as pb
from ._methods import AUTHENTICATE
from .config import EtcdConfig
from .endpoints import Endpoint, EndpointPool

log = logging.getLogger("waypost.etcd")

#: call metadata: the token, and ``hasleader`` for streams that need a leader
Metadata = tuple[tuple[str, str], ...] | None


class Auth:
    """Token state of one client (on the control loop). Without a user name it sends nothing."""

    def __init__(self, cfg: EtcdConfig, pool: EndpointPool, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.pool = pool
        self.clock = clock
        self._token: str | None = None
        self._disabled = False  # the server said auth is not enabled
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        """True when the client was configured with a user name."""
        return bool(self.cfg.username)

    @property
    def current(self) -> str | None:
        """The token held now (None before the first authentication or after a rejection)."""
        return self._token

    async def token(self, ep: Endpoint | None = None) -> str | None:
        """The auth token to send (authenticating first if needed), or None without auth."""
        if not self.cfg.username or self._disabled:
            return None
        tok = self._token
        if tok is not None:
            return tok
        async with self._lock:
            if self._token is None and not self._disabled:
                await self._authenticate(ep)
            return self._token

    def invalidate(self, token: str | None) -> None:
        """Forget ``token`` (if still current) so the next call authenticates again."""
        if self._token == token:
            self._token = None
        self._disabled = False

    def invalidate_sent(self, md: Metadata) -> None:
        """Forget the token that was sent with ``md`` (a call was refused with it)."""
        self.invalidate(dict(md or ()).get("token"))

    async def metadata(self, ep: Endpoint | None = None, *, require_leader: bool = False) -> Metadata:
        """Call metadata: the auth token, and ``hasleader`` for streams that need a leader."""
        tok = await self.token(ep)
        md: list[tuple[str, str]] = []
        if tok:
            md.append(("token", tok))
        if require_leader:
            md.append(("hasleader", "true"))
        return tuple(md) or None

    async def _authenticate(self, ep: Endpoint | None) -> None:
        cfg = self.cfg
        req = pb.AuthenticateRequest(name=cfg.username or "", password=cfg.password or "")
        deadline = self.clock() + cfg.dial_timeout + cfg.request_timeout
        attempts = 0
        while True:
            if ep is None or attempts:
                ep = await self.pool.pick("authenticate", timeout=max(min(cfg.dial_timeout,
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
                    self._disabled = True
                    return
                if e.code() in _errors.UNAVAILABLE_CODES:
                    self.pool.mark_failed(ep)
                    if attempts <= len(self.pool.endpoints) and self.clock() < deadline:
                        continue
                if "authentication failed" in d:
                    raise PermissionDenied(
                        f"etcd authenticate failed: wrong user name or password for user {cfg.username!r}"
                    ) from None
                raise _errors.map_error(e, "authenticate", ep.address) from None
            self.pool.mark_ok(ep)
            self._token = resp.token
            log.debug("authenticated to etcd as %r", cfg.username)
            return
