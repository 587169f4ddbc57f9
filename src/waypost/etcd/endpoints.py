"""A set of etcd endpoints: one grpc.aio channel each, failover, and liveness options.

A call goes to the current endpoint while it is connected. When it fails with UNAVAILABLE or a
deadline, the endpoint is marked failed and the next connected one is used; a failed endpoint
is preferred last for ``failure_cooldown`` seconds but is never locked out, and its channel keeps
reconnecting in the background (with a short capped backoff).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from .. import _fork
from ..errors import RegistryUnavailable
from .config import EtcdConfig

log = logging.getLogger("waypost.etcd")

_READY = grpc.ChannelConnectivity.READY
#: seconds a diagnostic call waits to learn why an endpoint is not connected (``why_unreachable``)
PROBE_TIMEOUT = 0.25


def connect_error(details: str) -> str:
    """The cause in grpc's connect error: ``failed to connect to all addresses; last error: UNKNOWN:
    ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused`` -> ``Failed to connect to
    remote host: Connection refused``."""
    cause = details.rpartition("last error: ")[2]
    code, sep, rest = cause.partition(": ")
    if sep and code.isupper():
        cause = rest
    if cause.startswith(("ipv4:", "ipv6:", "unix:")):
        cause = cause.split(": ", 1)[-1]
    return cause


def channel_options(cfg: EtcdConfig) -> list[tuple[str, Any]]:
    """gRPC channel options: liveness within ~10 s, quick reconnects, big messages, own subchannels."""
    return [
        ("grpc.keepalive_time_ms", cfg.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", cfg.keepalive_timeout_ms),
        # without this a frozen (SIGSTOPped) peer is not noticed for a minute even with keepalive
        ("grpc.http2.ping_timeout_ms", cfg.keepalive_timeout_ms),
        ("grpc.http2.max_pings_without_data", 0),
        # etcd counts pings without an open stream as abuse; idle unary channels rely on deadlines
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.enable_retries", 0),
    ]


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise RegistryUnavailable(f"cannot read etcd TLS {what} file {path!r}: {e.strerror}") from None


def credentials(cfg: EtcdConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials from the configured files, or None for plaintext."""
    if not (cfg.tls or cfg.ca_file or cfg.cert_file):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(cfg.ca_file, "CA"),
        private_key=_read(cfg.key_file, "key"),
        certificate_chain=_read(cfg.cert_file, "certificate"),
    )


class Endpoint:
    """One etcd member address with its channel."""

    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        #: None while the pool is suspended for a fork (see EndpointPool.suspend_for_fork)
        self.channel: Any = channel
        self.failed_at: float | None = None
        self._unary: dict[str, Any] = {}
        self._stream: dict[str, Any] = {}

    def unary(self, method: str, req_type: Any, resp_type: Any) -> Any:
        """The channel's unary callable for ``method``, made once."""
        return self._callable(self._unary, "unary_unary", method, req_type, resp_type)

    def stream(self, method: str, req_type: Any, resp_type: Any) -> Any:
        """The channel's bidirectional-stream callable for ``method``, made once."""
        return self._callable(self._stream, "stream_stream", method, req_type, resp_type)

    def _callable(self, cache: dict[str, Any], kind: str, method: str, req_type: Any, resp_type: Any) -> Any:
        mc = cache.get(method)
        if mc is None:
            if self.channel is None:
                raise RegistryUnavailable(f"etcd {self.address}: the connection is paused for a fork")
            mc = getattr(self.channel, kind)(
                method, request_serializer=req_type.SerializeToString, response_deserializer=resp_type.FromString,
            )
            cache[method] = mc
        return mc

    def __repr__(self) -> str:
        return f"<Endpoint {self.address}>"


class EndpointPool:
    """The endpoints of one client. Create and use it on the control loop only."""

    def __init__(self, cfg: EtcdConfig, clock: Callable[[], float] = time.monotonic) -> None:
        _fork.check_child_can_use_grpc("etcd client")
        self.cfg = cfg
        self.clock = clock
        self._creds = credentials(cfg)
        self._opts = channel_options(cfg)
        self.endpoints: list[Endpoint] = [Endpoint(addr, self._new_channel(addr)) for addr in cfg.endpoints]
        self._current = 0
        self._closed = False
        #: set while the channels are closed for a fork; set() when they are back (see _fork)
        self._fork_pause: asyncio.Event | None = None
        #: bumped at each suspension: a call that failed under a newer generation was cut by it, not by etcd
        self.generation = 0
        self._abandoned = False
        #: called with an endpoint when a call on it failed (streams on it may move elsewhere)
        self.failure_listeners: list[Callable[[Endpoint], None]] = []

    def _new_channel(self, addr: str) -> grpc.aio.Channel:
        if self._creds is not None:
            return grpc.aio.secure_channel(addr, self._creds, options=self._opts)
        return grpc.aio.insecure_channel(addr, options=self._opts)

    # -- fork (waypost._fork, through EtcdClient): no grpc.aio channel may exist while the process forks --

    async def suspend_for_fork(self) -> None:
        """Close and drop every channel; picks wait for ``resume_after_fork`` (streams reconnect then)."""
        if self._closed or self._fork_pause is not None:
            return
        self._fork_pause = asyncio.Event()
        self.generation += 1
        channels = []
        for ep in self.endpoints:
            channels.append(ep.channel)
            ep.channel = None
            ep._unary.clear()
            ep._stream.clear()
        for ch in channels:
            try:
                await ch.close()
            except Exception:  # pragma: no cover - closing is best effort
                log.debug("closing an etcd channel before fork failed", exc_info=True)
        del channels
        for _ in range(3):  # let the calls cut by close() end and drop their references to the channels
            await asyncio.sleep(0)

    def resume_after_fork(self) -> None:
        """In the parent after the fork: new channels, waiting picks go on."""
        pause, self._fork_pause = self._fork_pause, None
        if pause is None:
            return
        if not self._closed:
            for ep in self.endpoints:
                ep.channel = self._new_channel(ep.address)
        pause.set()

    def abandon_after_fork(self) -> None:
        """In a child: this pool belongs to the parent; it never touches grpc again."""
        self._abandoned = True
        self._closed = True

    def closed_error(self, op: str) -> RegistryUnavailable:
        """The error an operation ``op`` gets once the pool is closed (or abandoned in a forked child)."""
        if self._abandoned:
            return RegistryUnavailable(
                f"etcd {op}: this etcd client was created before fork() in the parent process; "
                "use waypost.connect()/dial() again in the child (they make fresh clients)")
        return RegistryUnavailable(f"etcd {op}: the client is closed")

    def _suspect(self, ep: Endpoint, now: float) -> bool:
        return ep.failed_at is not None and now - ep.failed_at < self.cfg.failure_cooldown

    def mark_failed(self, ep: Endpoint, notify: bool = True) -> None:
        """Prefer other endpoints for a while; move the current pointer past this one. ``notify``: tell the
        failure listeners too (the streams on ``ep`` move elsewhere)."""
        first = ep.failed_at is None
        ep.failed_at = self.clock()
        n = len(self.endpoints)
        if n > 1 and self.endpoints[self._current] is ep:
            self._current = (self._current + 1) % n
        # once per outage at INFO; repeats while it stays down are DEBUG
        log.log(logging.INFO if first else logging.DEBUG, "etcd endpoint %s failed; %s", ep.address,
                "trying the others" if n > 1 else "will retry it")
        if not notify:
            return
        for cb in list(self.failure_listeners):
            try:
                cb(ep)
            except Exception:
                log.exception("endpoint failure listener raised")

    def skip(self, ep: Endpoint) -> None:
        """Move the current pointer past ``ep`` without counting it as failed (it answered, but cannot serve
        this now: no leader)."""
        n = len(self.endpoints)
        if n > 1 and self.endpoints[self._current] is ep:
            self._current = (self._current + 1) % n

    def ready_other(self, exclude: set[Endpoint]) -> Endpoint | None:
        """A connected endpoint not in ``exclude``, healthy ones first (it becomes the current one); None when
        there is none right now (the others are asked to connect)."""
        if self._fork_pause is not None or self._abandoned or self._closed:
            return None
        now = self.clock()
        found: Endpoint | None = None
        n = len(self.endpoints)
        for i in range(n):
            ep = self.endpoints[(self._current + i) % n]
            if ep in exclude or ep.channel is None or ep.channel.get_state(True) is not _READY:
                continue
            if not self._suspect(ep, now):
                found = ep
                break
            found = found or ep
        if found is not None:
            self._current = self.endpoints.index(found)
        return found

    def mark_ok(self, ep: Endpoint) -> None:
        """A call succeeded on ``ep``: it is healthy again."""
        ep.failed_at = None

    def ready_now(self) -> Endpoint | None:
        """The current endpoint if it is connected and not suspect (the fast path)."""
        if self._fork_pause is not None or self._abandoned or self._closed:
            return None
        ep = self.endpoints[self._current]
        if ep.channel.get_state(False) is _READY and ep.failed_at is None:
            return ep
        return None

    async def pick(self, op: str, timeout: float | None = None) -> Endpoint:
        """A connected endpoint, preferring the current one and healthy ones.

        Waits up to ``timeout`` (default: dial_timeout) for any endpoint to connect, then raises
        RegistryUnavailable naming the operation and the endpoints.
        """
        fast = self.ready_now()
        if fast is not None:
            return fast
        if self._closed:
            raise self.closed_error(op)
        wait = self.cfg.dial_timeout if timeout is None else timeout
        deadline = self.clock() + wait
        delay = 0.005
        n = len(self.endpoints)
        while True:
            pause = self._fork_pause
            if pause is not None:  # a fork in progress: the channels are back right after it
                try:
                    await asyncio.wait_for(pause.wait(), max(deadline - self.clock(), 0.001))
                except asyncio.TimeoutError:
                    raise RegistryUnavailable(f"etcd {op}: the connection stayed paused for a fork "
                                              f"longer than {wait:g}s") from None
                if self._closed:
                    raise self.closed_error(op)
                continue
            if self._closed:  # closed while waiting: its channels are gone
                raise self.closed_error(op)
            now = self.clock()
            fallback: int | None = None
            for i in range(n):
                idx = (self._current + i) % n
                ep = self.endpoints[idx]
                if ep.channel.get_state(True) is _READY:
                    if not self._suspect(ep, now):
                        if ep.failed_at is not None:
                            ep.failed_at = None
                        self._current = idx
                        return ep
                    if fallback is None:
                        fallback = idx
            if fallback is not None and (n == 1 or now >= deadline - wait / 2):
                # only suspect endpoints are connected: use one rather than fail
                self._current = fallback
                return self.endpoints[fallback]
            if self._closed:
                raise self.closed_error(op)
            if now >= deadline:
                reasons = await self.why_unreachable()
                raise RegistryUnavailable(
                    f"etcd {op}: no endpoint reachable within {round(wait, 2):g}s "
                    f"(endpoints: {', '.join(self.cfg.endpoints)})" + (f"; {reasons[0]}" if reasons else "")
                )
            await asyncio.sleep(min(delay, max(deadline - now, 0.001)))
            delay = min(delay * 2, 0.05)

    async def why_unreachable(self) -> list[str]:
        """Why the endpoints that are not connected fail, as grpc saw it (connection refused, a TLS handshake
        failure, ...), each logged at DEBUG: ``address: reason``. One call per endpoint that fails at once
        (no wait for ready) or within ``PROBE_TIMEOUT``; only on the failure path."""
        from ._generated import waypost_etcd_pb2 as pb
        from ._methods import STATUS

        async def probe(ep: Endpoint) -> str | None:
            if ep.channel is None or ep.channel.get_state(False) is _READY:
                return None
            try:
                await ep.unary(STATUS, pb.StatusRequest, pb.StatusResponse)(pb.StatusRequest(),
                                                                            timeout=PROBE_TIMEOUT)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return f"{ep.address}: no connection within {PROBE_TIMEOUT:g}s (connecting)"
                return f"{ep.address}: {connect_error(e.details() or e.code().name)}"
            except Exception as e:  # noqa: BLE001 -- a diagnosis only: never fail because of it
                return f"{ep.address}: {e!r}"
            return None  # it answered: connected meanwhile

        reasons = [r for r in await asyncio.gather(*(probe(ep) for ep in self.endpoints)) if r]
        for reason in reasons:
            log.debug("etcd endpoint %s", reason)
        return reasons

    async def close(self) -> None:
        self._closed = True
        if self._abandoned:
            return  # the channels are the parent's: never touched in a child
        for ep in self.endpoints:
            channel, ep.channel = ep.channel, None
            # drop the multicallables too: a closed grpc.aio channel still referenced keeps grpc.aio's poller
            # thread alive, and with it alive no later fork of this process can use gRPC (waypost._fork)
            ep._unary.clear()
            ep._stream.clear()
            if channel is None:
                continue
            try:
                await channel.close()
            except Exception:  # pragma: no cover - closing is best effort
                log.debug("closing channel to %s failed", ep.address, exc_info=True)
