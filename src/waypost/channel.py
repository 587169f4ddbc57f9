"""``waypost.dial``: a drop-in ``grpc.Channel`` that balances every call over the resolved backends.

Each backend address gets its own real grpc channel (``client.subconn``); each call picks a READY backend
with the configured policy, runs on that backend's cached multicallable, and reports its outcome to the
picker (the multicallables: ``client.sync_unary_calls``, ``client.sync_stream_calls``). Generated stubs work
unchanged. This module holds the channel itself: its backends, connectivity, close, and ``dial``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from . import _fork
from ._grpc_private import connectivity_probe
from .client.balancer_wrapper import BalancerWrapper
from .client.channel_base import ChannelBase
from .client.channel_config import ChannelConfig, dial_config
from .client.dial_options import DialKeywords
from .client.empty_key import EmptyKey
from .client.health import watch_health
from .client.method import by_kind
from .client.subconn import SubConn
from .client.sync_stream_calls import StreamStreamMultiCallable, UnaryStreamMultiCallable
from .client.sync_unary_calls import StreamUnaryMultiCallable, UnaryUnaryMultiCallable
from .client.watcher import WATCHER
from .types import STATE_NAMES

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .discovery.store import Registry

log = logging.getLogger("waypost.channel")

_CONNECTIVITY = tuple(grpc.ChannelConnectivity)  # index = core state int


class Channel(ChannelBase, grpc.Channel):
    """A grpc.Channel over many backends. Build it with ``waypost.dial``."""

    multicallables = by_kind(UnaryUnaryMultiCallable, UnaryStreamMultiCallable, StreamUnaryMultiCallable,
                             StreamStreamMultiCallable)

    def __init__(self, config: ChannelConfig, *, options: Sequence[tuple[str, Any]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None, block: bool = True) -> None:
        super().__init__(config, options, credentials)
        health = self._health_service
        self._subscribers: dict[Callable[[grpc.ChannelConnectivity], None], int] = {}
        self._sub_lock = threading.Lock()
        self._closed = False
        # may raise (bad target, bad resolver option): before any backend channel or the watcher exists
        self._resolver = config.make_resolver(self._options, blocking=block)
        self._balancer = BalancerWrapper(
            self.target,
            config.policy,
            make_channel=self._make_backend_channel,
            probe=connectivity_probe,
            close_channel=_close_channel,
            health_service=health,
            routing=config.routing,
            empty=EmptyKey.for_target(config.target),
            start_health=self._start_health if health is not None else None,
            stop_health=_stop_health if health is not None else None,
            resolve_now=self._resolve_now,
            on_refork=self._on_refork,
        )
        WATCHER.add(self._balancer)
        try:
            self._resolver.start(self._balancer.update, self._balancer.resolver_error)
        except BaseException:
            self.close()
            raise

    # backends

    def _make_backend_channel(self, address: str) -> grpc.Channel:
        if self._credentials is not None:
            return grpc.secure_channel(address, self._credentials, options=self._options)
        return grpc.insecure_channel(address, options=self._options)

    def _start_health(self, sc: SubConn) -> _fork.PausableTask:

        b = self._balancer
        service = self._config.health_service or ""
        creds, options = self._credentials, self._options

        async def run() -> None:
            ch = grpc.aio.secure_channel(sc.address, creds, options=options) if creds is not None else \
                grpc.aio.insecure_channel(sc.address, options=options)
            try:
                await watch_health(ch, service, lambda ok, note: b.set_health(sc, ok, note))
            finally:
                await ch.close()

        return _fork.PausableTask(run).start()  # stops for a fork: no grpc.aio channel may be open then

    def _resolve_now(self, reason: str) -> None:
        self._resolver.resolve_now(reason)  # the current resolver: a forked child replaces it (_on_refork)

    def _on_refork(self) -> None:
        # In a forked child: the inherited resolver's registry client belongs to the parent (waypost._fork);
        # a new one follows the registry from here, in the background (calls use the last known backends).
        WATCHER.add(self._balancer)
        resolver = self._config.make_resolver(self._options, blocking=False)
        self._resolver = resolver
        resolver.start(self._balancer.update, self._balancer.resolver_error)

    # grpc.Channel (the multicallable makers: MulticallableFactory)

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        """Call ``callback(state)`` now and whenever the aggregate state changes (READY when any backend is)."""
        state = self._balancer.connectivity()
        with self._sub_lock:
            first = not self._subscribers
            self._subscribers[callback] = state
            if first:
                self._balancer.add_listener(self._notify)
        callback(_CONNECTIVITY[state])

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._sub_lock:
            self._subscribers.pop(callback, None)
            if not self._subscribers:
                self._balancer.remove_listener(self._notify)

    def _notify(self) -> None:
        state = self._balancer.connectivity()
        with self._sub_lock:
            due = [cb for cb, last in self._subscribers.items() if last != state]
            for cb in due:
                self._subscribers[cb] = state
        for cb in due:
            try:
                cb(_CONNECTIVITY[state])
            except Exception:
                log.exception("waypost: connectivity callback failed")

    def close(self) -> None:
        """Stop the resolver and release every backend channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._resolver.close()
        except Exception:
            log.exception("waypost: closing resolver of %s", self.target)
        WATCHER.discard(self._balancer)
        self._balancer.close()

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<waypost.Channel {self.target} {STATE_NAMES[self._balancer.connectivity()]}>"


def _close_channel(channel: grpc.Channel) -> None:
    channel.close()


def _stop_health(handle: _fork.PausableTask) -> None:
    handle.cancel()


def dial(target: str | Sequence[str] | Registry, **options: Unpack[DialKeywords]) -> grpc.Channel:
    """A balanced ``grpc.Channel`` to ``target`` (``etcd://``, ``direct:///``, ``dns:///``, ``k8s://``, ``consul://``,
    ``zk://``...: see docs/discovery.md); a list of targets follows all of them and uses the union (registries that
    back each other up: ``waypost.resolver.multi``).

    The keywords are the fields of ``waypost.DialOptions`` (their defaults and meanings; ``waypost.aio.dial``
    takes the same ones).

    ``balancer`` names the policy (a shortcut for ``loadBalancingConfig``; it must agree with the service
    config when both name one); with neither, ``waypost.service_config.DEFAULT_POLICY`` (prequal: the
    servers' load read from every response, and peak_ewma -- the best of four backends by peak latency estimate x
    calls in flight -- where servers send none; see docs/policies.md).
    ``service_config`` is gRPC's JSON (dict or text), validated here: anything invalid raises
    ``waypost.InvalidServiceConfig``; a bad target raises ``waypost.InvalidTarget``. ``interceptors`` are applied as ``grpc.intercept_channel``
    does (outcomes are still reported per attempt). ``subset_size`` (default 32) and ``client_id``
    (deterministic subsetting) apply to registry targets.

    ``block`` (registry targets): True (the default) waits here for the first address list, up to 5 s,
    and raises ``waypost.RegistryUnavailable`` naming the registry and why it cannot be read (``etcd at
    h:2379 unreachable: connection refused``). A ``dns:///`` target waits for its first lookup (bounded by the
    lookup timeout) and never raises for a name that does not resolve yet (its calls say why). False returns at once and loads in the background: calls
    wait for the first list up to their deadline; once the registry is known to be unreachable (a fraction
    of a second) calls fail with UNAVAILABLE whose details say so (``wait_for_ready`` calls wait on, and
    DEADLINE_EXCEEDED names it too), and the load is retried until it succeeds.

    ``retries=N``: a retryPolicy for every method: N retries on UNAVAILABLE (maxAttempts N+1, at most 5),
    backoff 0.05 s doubling to 1 s; an error next to a service config with a retryPolicy of its own. Only for
    services whose methods are safe to run twice (docs/service-config.md). Without it, a call that never
    reached a server is still re-picked once or more ("transparent" retry).
    ``metadata_filter={"group": "canary"}``: use only the backends whose registration metadata matches.
    ``prefer={"zone": "us-east-1a"}, min_preferred=N`` (default 1): use only the matching backends while at
    least N of them are READY, else all of them (docs/discovery.md, "Routing by metadata").
    """
    config, opts = dial_config("waypost.dial", target, options)
    channel: grpc.Channel = Channel(config, options=opts.options, credentials=opts.credentials, block=opts.blocks(True))
    interceptors = list(opts.interceptors or ())
    if interceptors:
        channel = grpc.intercept_channel(channel, *interceptors)
    return channel
