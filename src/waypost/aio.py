"""``waypost.aio.dial``: a drop-in ``grpc.aio.Channel`` balancing every call over the resolved backends.

Same core as the sync channel (``waypost.client``): one real ``grpc.aio`` channel per backend, a picker over
the READY ones, outcomes reported per attempt, retries on another backend. Everything runs on the event
loop the channel is used from: resolver updates from other threads are handed to it, connectivity is
polled by one task per channel (``get_state`` is a cheap non-blocking call), health watches are tasks.

Outcomes are reported by our own call objects (``waypost.client.aio_unary_calls`` and ``aio_stream_calls``:
``call.code()`` is a coroutine in grpc.aio, and interceptors wrap call objects), so they work with and
without interceptors.
A unary-unary call whose backend is ready at once (the usual case) costs no task of ours: its first
attempt starts in the call's constructor and its end is handled in grpc.aio's done callback; a retry, a
pick that has to wait, or interceptors take the task path.

Retries: every call kind, before the first response message. Client-streaming requests (a sync or async
iterator, or ``write()`` / ``done_writing()``) are recorded as they are sent and replayed into the next
attempt; past ``waypost.client.replay.REPLAY_LIMIT`` messages the call is committed to its attempt (no more retries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from .client.aio_stream_calls import StreamStreamMultiCallable, UnaryStreamMultiCallable
from .client.aio_unary_calls import StreamUnaryMultiCallable, UnaryUnaryMultiCallable
from .client.aio_wait import AioPickWaiter
from .client.balancer_wrapper import BalancerWrapper
from .client.channel_base import ChannelBase
from .client.channel_config import ChannelConfig, dial_config
from .client.dial_options import DialKeywords
from .client.empty_key import EmptyKey
from .client.health import watch_health
from .client.method import by_kind
from .client.subconn import SubConn
from .client.watcher import INTERVAL
from .types import STATE_NAMES, Backend

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .discovery.store import Registry
    from .server import serve_async as serve

__all__ = ["Channel", "dial", "serve"]

_T = TypeVar("_T")

log = logging.getLogger("waypost.aio")

_CONNECTIVITY = tuple(grpc.ChannelConnectivity)  # index = core state int


class Channel(ChannelBase, grpc.aio.Channel):
    """A grpc.aio.Channel over many backends. Build it with ``waypost.aio.dial``; use it on one event loop."""

    multicallables = by_kind(UnaryUnaryMultiCallable, UnaryStreamMultiCallable, StreamUnaryMultiCallable,
                             StreamStreamMultiCallable)

    def __init__(self, config: ChannelConfig, *, options: Sequence[tuple[str, Any]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None, interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
                 block: bool = False) -> None:
        super().__init__(config, options, credentials)
        self._interceptors = list(interceptors or ()) or None
        health = self._health_service
        # may raise (bad target, bad resolver option): before any task exists; never blocks the event loop
        self._resolver = config.make_resolver(self._options, blocking=False, report_early=not block)
        self._balancer = BalancerWrapper(
            self.target,
            config.policy,
            make_channel=self._make_backend_channel,
            probe=_probe,
            close_channel=self._close_backend_channel,
            health_service=health,
            routing=config.routing,
            empty=EmptyKey.for_target(config.target, deliver=lambda done: self._post(lambda _: done(), None)),
            start_health=self._start_health if health is not None else None,
            stop_health=_stop_task if health is not None else None,
            resolve_now=self._resolver.resolve_now,
        )
        # wakes waiting picks and this channel's own waits at every change (runs on the loop: see _post)
        self._waiter = AioPickWaiter(self._balancer.pickers, self._ensure_loop)
        self._balancer.add_listener(self._waiter.changed)
        self._balancer.pickers.on_wake = self._waiter.changed  # a backend at its concurrency limit freed (on the loop)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[Callable[[Any], None], object]] = []
        self._closing: set[asyncio.Future[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        with suppress(RuntimeError):  # no loop yet: bind on first use
            self._bind(asyncio.get_running_loop())
        try:
            self._resolver.start(self._on_update, self._on_resolver_error)
        except BaseException:
            self._closed = True
            if self._poller is not None:
                self._poller.cancel()
            self._balancer.close()
            raise

    # event-loop plumbing

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._poller = loop.create_task(self._poll_forever())
        pending, self._pending = self._pending, []
        for fn, arg in pending:
            fn(arg)

    def _ensure_loop(self) -> None:
        if self._loop is None:
            self._bind(asyncio.get_running_loop())

    def _post(self, fn: Callable[[_T], None], arg: _T) -> None:
        loop = self._loop
        if loop is None:
            self._pending.append((fn, arg))
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(arg)
        else:
            loop.call_soon_threadsafe(fn, arg)

    def _on_update(self, backends: Sequence[Backend]) -> None:
        self._post(self._balancer.update, list(backends))

    def _on_resolver_error(self, message: str) -> None:
        self._post(self._balancer.resolver_error, message)

    async def _poll_forever(self) -> None:
        b = self._balancer
        while not self._closed:
            try:
                b.poll()
            except Exception:
                log.exception("waypost: connectivity poll failed for %s", self.target)
            await asyncio.sleep(INTERVAL)

    # backends

    def _make_backend_channel(self, address: str) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(address, self._credentials, options=self._options,
                                           interceptors=self._interceptors)
        return grpc.aio.insecure_channel(address, options=self._options, interceptors=self._interceptors)

    def _close_backend_channel(self, channel: grpc.aio.Channel) -> None:
        fut = asyncio.ensure_future(channel.close())
        self._closing.add(fut)
        fut.add_done_callback(self._closing.discard)

    def _start_health(self, sc: SubConn) -> asyncio.Task[None]:
        b = self._balancer
        return asyncio.ensure_future(watch_health(sc.channel, self._config.health_service or "",
                                                  lambda ok, note: b.set_health(sc, ok, note)))

    @property
    def waiter(self) -> AioPickWaiter:
        """This channel's change event and the awaitable slow path of a pick (what calls use)."""
        return self._waiter

    # grpc.aio.Channel (the multicallable makers: MulticallableFactory)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """READY when any backend is usable; otherwise CONNECTING / TRANSIENT_FAILURE / IDLE."""
        if try_to_connect:
            self._ensure_loop()
        return _CONNECTIVITY[self._balancer.connectivity()]  # type: ignore[no-any-return]

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        self._ensure_loop()
        while self.get_state() == last_observed_state and not self._closed:
            await self._waiter.event.wait()

    async def channel_ready(self) -> None:
        self._ensure_loop()
        while self.get_state(True) != grpc.ChannelConnectivity.READY:
            if self._closed:
                raise grpc.aio.UsageError("channel closed")
            await self._waiter.event.wait()

    async def close(self, grace: float | None = None) -> None:
        """Stop the resolver, close every backend channel (in-flight calls get ``grace`` seconds)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._resolver.aclose()
        except Exception:
            log.exception("waypost: closing resolver of %s", self.target)
        if self._poller is not None:
            self._poller.cancel()
        scs = self._balancer.close()
        if self._loop is not None:
            await asyncio.gather(*[sc.channel.close(grace) for sc in scs], *self._closing,
                                 return_exceptions=True)

    async def __aenter__(self) -> Channel:  # noqa: PYI034
        return self

    async def __aexit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        await self.close(None)

    def __repr__(self) -> str:
        return f"<waypost.aio.Channel {self.target} {STATE_NAMES[self._balancer.connectivity()]}>"


def _probe(channel: grpc.aio.Channel) -> Callable[[bool], int]:
    def state(try_to_connect: bool) -> int:
        return channel.get_state(try_to_connect).value[0]  # type: ignore[no-any-return]

    return state


def _stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()


def dial(target: str | Sequence[str] | Registry, **options: Unpack[DialKeywords]) -> Channel:
    """A balanced ``grpc.aio.Channel`` (same arguments as ``waypost.dial``). ``interceptors`` are grpc.aio
    client interceptors, applied to every attempt on its backend. Registry targets resolve in the
    background: calls wait for the first address list (up to their deadline).

    ``block`` (registry targets) never blocks the event loop: dial always returns at once. False (the
    default): as soon as the registry is known to be unreachable (a fraction of a second), calls fail with
    UNAVAILABLE whose details name it (``etcd at h:2379 unreachable: connection refused``); the load is
    retried until it succeeds. True: the first calls (and ``await channel.channel_ready()``) wait for the
    first address list as the sync ``waypost.dial`` does, up to their deadline or until the first load
    gives up (5 s), then fail with UNAVAILABLE naming the registry and why.

    ``retries``, ``metadata_filter``, ``prefer``, ``min_preferred``: as for ``waypost.dial``."""
    config, opts = dial_config("waypost.aio.dial", target, options)
    return Channel(config, options=opts.options, credentials=opts.credentials,
                   interceptors=list(opts.interceptors or ()), block=opts.blocks(False))


def __getattr__(name: str) -> object:
    # ``waypost.aio.serve`` is ``waypost.serve_async`` (imported lazily: the server module is heavier)
    if name == "serve":
        from .server import serve_async

        return serve_async
    raise AttributeError(f"module 'waypost.aio' has no attribute {name!r}")
