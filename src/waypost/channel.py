"""``waypost.dial``: a drop-in ``grpc.Channel`` that balances every call over the resolved backends.

Each backend address gets its own real grpc channel (``client.subconn``); each call picks a READY backend
with the configured policy, runs on that backend's cached multicallable, and reports its outcome to the
picker. Generated stubs work unchanged.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from . import _fork
from .balancer.base import PickError, PickInfo, PickResult
from .balancer.hashkey import current_hash_key
from .client.config import ChannelConfig, build_config
from .client.core import Balancer, attach_resolver
from .client.future import ThreadFuture
from .client.health import watch_health
from .client.method import MethodBase
from .client.options import merge_options
from .client.rpcerror import BalancerRpcError
from .client.subconn import STATE_NAMES, SubConn
from .client.watcher import WATCHER
from .retry import MAX_TRANSPARENT, Replay, RetryingStream, RetryState, avoid_tried, never_sent

log = logging.getLogger("waypost.channel")

_OK = grpc.StatusCode.OK
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_UNKNOWN = grpc.StatusCode.UNKNOWN
_CANCELLED = grpc.StatusCode.CANCELLED
_perf = time.perf_counter
_mono = time.monotonic

_CONNECTIVITY = tuple(grpc.ChannelConnectivity)  # index = core state int


def _wait_pick(b: Balancer, info: PickInfo, deadline: float | None, wait_for_ready: bool | None
               ) -> tuple[PickResult, SubConn]:
    """The slow path of a pick: no usable backend right now. Wait (bounded by the deadline) while backends
    are connecting or the call is wait_for_ready; otherwise fail at once with UNAVAILABLE."""
    while True:
        version = b.version
        try:
            r = b.pick(info)
        except PickError as e:
            raise BalancerRpcError(e.code, e.message) from None
        if r is not None:
            return r
        if not b.should_wait(wait_for_ready):
            raise b.unavailable()
        with b.cond:
            if b.version != version:
                continue
            if deadline is None:
                b.cond.wait(1.0)
            else:
                remaining = deadline - _mono()
                if remaining <= 0:
                    raise b.deadline_exceeded()
                b.cond.wait(min(remaining, 1.0))


class _Method(MethodBase):
    """What the four multicallable kinds share: the method's settings and the per-attempt pick."""

    def __init__(self, channel: Channel, method: str, request_serializer: Any, response_deserializer: Any,
                 registered: Any) -> None:
        super().__init__(channel, method, request_serializer, response_deserializer, registered)
        self._fast_ok = self._retry is None and self._kind == "unary_unary"

    def _pick(self, info: PickInfo, deadline: float | None, wfr: bool | None) -> tuple[PickResult, SubConn]:
        try:
            r = self._b.pick(info)
        except PickError as e:
            raise BalancerRpcError(e.code, e.message) from None
        if r is None:
            r = _wait_pick(self._b, info, deadline, wfr)
        return r

    def _pick_for(self, st: RetryState, info: PickInfo, wfr: bool | None) -> tuple[PickResult, SubConn]:
        r = self._pick(info, st.deadline, wfr)
        if st.tried:
            r = avoid_tried(r, st.tried, lambda: list(self._b._snap.subconns.values()),
                            lambda: self._b.pick(info))
        st.tried.add(r[1].address)
        return r

    def _settings(self, timeout: float | None, wait_for_ready: bool | None
                  ) -> tuple[float | None, bool | None]:
        if timeout is None:
            timeout = self._timeout
        if wait_for_ready is None:
            wait_for_ready = self._wfr
        return (None if timeout is None else _mono() + timeout), wait_for_ready

    def _state(self, deadline: float | None) -> RetryState:
        return RetryState(self._retry, self._throttle, self._rng, deadline)


# ---- unary request ------------------------------------------------------------------------------


class _UnaryRequestMethod(_Method):
    """unary_unary and stream_unary: one response, so a whole attempt is one blocking inner call."""

    def _request_for(self, request: Any, replay: Replay | None) -> Any:
        return request if replay is None else replay.attempt()

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        if self._fast_ok:
            return self._once(request, timeout, metadata, credentials, wait_for_ready, compression, False)
        return self.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)[0]

    def with_call(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                  wait_for_ready: bool | None = None, compression: Any = None) -> tuple[Any, grpc.Call]:
        if self._fast_ok:
            return self._once(request, timeout, metadata, credentials, wait_for_ready, compression, True)
        deadline, wfr = self._settings(timeout, wait_for_ready)
        # Client streaming: requests are recorded for replay only when a retry policy may need them.
        replay = Replay(request) if self._kind == "stream_unary" and self._retry is not None else None
        return self._attempts(self._state(deadline), request, metadata, credentials, wfr, compression, replay)

    def _once(self, request: Any, timeout: float | None, metadata: Any, credentials: Any,
              wait_for_ready: bool | None, compression: Any, want_call: bool) -> Any:
        """The hot path (unary-unary, no retry policy): one pick, one attempt; a connection-level failure
        (the request never left) falls into the attempt loop for a transparent re-pick."""
        if timeout is None:
            timeout = self._timeout
        if wait_for_ready is None:
            wait_for_ready = self._wfr
        hk = current_hash_key()
        info = self._info if hk is None and not metadata else PickInfo(self._method, hk, tuple(metadata or ()))
        b = self._b
        try:
            r = b.pick(info)
        except PickError as e:
            raise BalancerRpcError(e.code, e.message) from None
        deadline = None
        if timeout is not None:
            deadline = _mono() + timeout
        if r is None:
            r = _wait_pick(b, info, deadline, wait_for_ready)
            if deadline is not None:
                timeout = max(deadline - _mono(), 0.0)
        res, sc = r
        mc = sc.mcs.get(self._key) or self._inner(sc)
        sc.inflight += 1
        t0 = _perf()
        try:
            if want_call:
                out = mc.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)
            else:
                out = mc(request, timeout, metadata, credentials, wait_for_ready, compression)
        except grpc.RpcError as e:
            code = e.code()
            self._finish(res, sc, t0, code)
            if code is not _UNAVAILABLE or not never_sent(code, e.details()):
                raise
            st = self._state(deadline)
            st.started = 1
            st.tried.add(sc.address)
            st.after_failure(code, e.details())
            out = self._attempts(st, request, metadata, credentials, wait_for_ready, compression, None)
            return out if want_call else out[0]
        except ValueError:
            # "Cannot invoke RPC on closed channel": the backend was removed and closed under this call
            # before it started (nothing was sent): pick again.
            self._finish(res, sc, t0, _CANCELLED)
            if not sc.removed:
                raise
            st = self._state(deadline)
            st.tried.add(sc.address)
            out = self._attempts(st, request, metadata, credentials, wait_for_ready, compression, None)
            return out if want_call else out[0]
        except BaseException:
            self._finish(res, sc, t0, _UNKNOWN)
            raise
        self._finish(res, sc, t0, _OK)
        return out

    def _attempts(self, st: RetryState, request: Any, metadata: Any, credentials: Any, wfr: bool | None,
                  compression: Any, replay: Replay | None) -> tuple[Any, grpc.Call]:
        while True:
            info = self._pick_info(metadata)
            res, sc = self._pick_for(st, info, wfr)
            md = st.metadata(metadata)
            mc = self._inner(sc)
            sc.inflight += 1
            t0 = _perf()
            try:
                out = mc.with_call(self._request_for(request, replay), st.timeout(), md, credentials, wfr,
                                   compression)
            except grpc.RpcError as e:
                code = e.code()
                self._finish(res, sc, t0, code)
                delay = st.after_failure(code, e.details())
                if delay is None or (replay is not None and not replay.replayable) or (
                        replay is None and self._kind == "stream_unary"):  # consumed requests: no replay
                    raise
                if delay:
                    time.sleep(delay)
                continue
            except ValueError:
                self._finish(res, sc, t0, _CANCELLED)
                if not sc.removed or st.transparent >= MAX_TRANSPARENT:
                    raise
                st.transparent += 1  # closed under us before the call started: nothing was sent
                continue
            except BaseException:
                self._finish(res, sc, t0, _UNKNOWN)
                raise
            self._finish(res, sc, t0, _OK)
            st.succeeded()
            return out  # type: ignore[no-any-return]

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
               wait_for_ready: bool | None = None, compression: Any = None) -> grpc.Future:
        deadline, wfr = self._settings(timeout, wait_for_ready)
        if self._retry is None:
            info = self._pick_info(metadata)
            try:
                r = self._b.pick(info)
            except PickError as e:
                return BalancerRpcError(e.code, e.message)
            if r is not None:
                res, sc = r
                sc.inflight += 1
                t0 = _perf()
                try:
                    fut = self._inner(sc).future(request, None if deadline is None else deadline - _mono(),
                                                 metadata, credentials, wfr, compression)
                except BaseException:
                    self._finish(res, sc, t0, _UNKNOWN)
                    raise
                fut.add_done_callback(lambda c: self._finish(res, sc, t0, c.code()))
                return fut  # type: ignore[no-any-return]
        # Waiting for a backend or retrying would block: run the blocking call on a worker thread.
        timeout = None if deadline is None else max(deadline - _mono(), 0.0)
        return ThreadFuture(self.with_call, request, timeout, metadata, credentials, wfr, compression)


class UnaryUnaryMultiCallable(_UnaryRequestMethod, grpc.UnaryUnaryMultiCallable):
    _kind = "unary_unary"


class StreamUnaryMultiCallable(_UnaryRequestMethod, grpc.StreamUnaryMultiCallable):
    _kind = "stream_unary"


# ---- streaming response --------------------------------------------------------------------------


class _StreamResponseMethod(_Method):
    """unary_stream and stream_stream: the call object is the response iterator."""

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        deadline, wfr = self._settings(timeout, wait_for_ready)
        if self._retry is None:
            info = self._pick_info(metadata)
            try:
                res, sc = self._pick(info, deadline, wfr)
            except BalancerRpcError as e:
                return e  # like grpc: the failed call is returned and raises when iterated
            return self._start(res, sc, request, None if deadline is None else deadline - _mono(), metadata,
                               credentials, wfr, compression)
        st = self._state(deadline)
        replay = Replay(request) if self._kind == "stream_stream" else None

        def start() -> Any:
            info = self._pick_info(metadata)
            res, sc = self._pick_for(st, info, wfr)
            req = request if replay is None else replay.attempt()
            return self._start(res, sc, req, st.timeout(), st.metadata(metadata), credentials, wfr, compression)

        def retry_delay(e: grpc.RpcError) -> float | None:
            if replay is not None and not replay.replayable:
                return None
            return st.after_failure(e.code(), e.details())

        try:
            return RetryingStream(start, retry_delay)
        except grpc.RpcError as e:  # no backend at all: return the failed call, as grpc does
            return e

    def _start(self, res: PickResult, sc: SubConn, request: Any, timeout: float | None, metadata: Any,
               credentials: Any, wfr: bool | None, compression: Any) -> Any:
        sc.inflight += 1
        t0 = _perf()
        try:
            call = self._inner(sc)(request, timeout, metadata, credentials, wfr, compression)
        except BaseException:
            self._finish(res, sc, t0, _UNKNOWN)
            raise
        call.add_done_callback(lambda c: self._finish(res, sc, t0, c.code()))
        return call


class UnaryStreamMultiCallable(_StreamResponseMethod, grpc.UnaryStreamMultiCallable):
    _kind = "unary_stream"


class StreamStreamMultiCallable(_StreamResponseMethod, grpc.StreamStreamMultiCallable):
    _kind = "stream_stream"


# ---- the channel ----------------------------------------------------------------------------------


class Channel(grpc.Channel):
    """A grpc.Channel over many backends. Build it with ``waypost.dial``."""

    def __init__(self, target: str, config: ChannelConfig, *, options: Sequence[tuple[str, Any]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        # Only the redacted form is kept: it appears in repr, logs and error details (no password).
        self.target = target = config.target.redacted
        self._config = config
        self._options = merge_options(options)
        self._credentials = credentials
        health = config.health_service
        self._balancer = Balancer(
            target,
            config.policy,
            make_channel=self._make_backend_channel,
            probe=_probe,
            close_channel=_close_channel,
            health_service=health,
            start_health=self._start_health if health is not None else None,
            stop_health=_stop_health if health is not None else None,
        )
        self._balancer._on_refork = self._on_refork  # type: ignore[method-assign]
        self._subscribers: dict[Callable[[grpc.ChannelConnectivity], None], int] = {}
        self._sub_lock = threading.Lock()
        self._closed = False
        self._resolver = config.make_resolver()  # may raise (bad target): before the watcher knows us
        attach_resolver(self._resolver, self._balancer, self._options)
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

    def _start_health(self, sc: SubConn) -> Any:

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

    def _on_refork(self) -> None:
        # In a forked child: the inherited resolver's registry client belongs to the parent (waypost._fork);
        # a new one follows the registry from here, in the background (calls use the last known backends).
        WATCHER.add(self._balancer)
        resolver = self._config.make_resolver()
        attach_resolver(resolver, self._balancer, self._options)
        if hasattr(resolver, "block"):
            resolver.block = False
        self._resolver = resolver
        resolver.start(self._balancer.update, self._balancer.resolver_error)

    @property
    def balancer(self) -> Balancer:
        """The backend set behind this channel (introspection and tests)."""
        return self._balancer

    # grpc.Channel

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    _registered_method: Any = False) -> UnaryUnaryMultiCallable:
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer, _registered_method)

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: Any = False) -> UnaryStreamMultiCallable:
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer, _registered_method)

    def stream_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     _registered_method: Any = False) -> StreamUnaryMultiCallable:
        return StreamUnaryMultiCallable(self, method, request_serializer, response_deserializer, _registered_method)

    def stream_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                      _registered_method: Any = False) -> StreamStreamMultiCallable:
        return StreamStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                         _registered_method)

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


def _probe(channel: grpc.Channel) -> Callable[[bool], int]:
    # The call grpc's own subscribe() polls with, bound once per backend (no Python frame per poll).
    return channel._channel.check_connectivity_state  # type: ignore[attr-defined,no-any-return]


def _close_channel(channel: grpc.Channel) -> None:
    channel.close()


def _stop_health(handle: _fork.PausableTask) -> None:
    handle.cancel()


def dial(
    target: str,
    balancer: str | None = None,
    service_config: Mapping[str, Any] | str | None = None,
    options: Sequence[tuple[str, Any]] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    interceptors: Iterable[Any] | None = None,
    *,
    subset_size: int | None = None,
    client_id: str | None = None,
    rng: random.Random | None = None,
) -> grpc.Channel:
    """A balanced ``grpc.Channel`` to ``target`` (see DESIGN.md §3 for target forms).

    ``balancer`` names the policy (a shortcut for ``loadBalancingConfig``; it must agree with the service
    config when both name one); with neither, ``p2c_ewma`` (go-zero's default). ``service_config`` is gRPC's
    JSON (dict or text), validated here: anything invalid raises ``waypost.InvalidServiceConfig``; a bad
    target raises ``waypost.InvalidTarget``. ``interceptors`` are applied as ``grpc.intercept_channel``
    does (outcomes are still reported per attempt). ``subset_size`` (default 32) and ``client_id``
    (deterministic subsetting) apply to registry targets.
    """
    _fork.check_child_can_use_grpc("waypost.dial")  # a child forked with grpc.aio alive: fail now, not hang
    config = build_config(target, balancer, service_config, subset_size=subset_size, client_id=client_id, rng=rng)
    channel: grpc.Channel = Channel(target, config, options=options, credentials=credentials)
    interceptors = list(interceptors or ())
    if interceptors:
        channel = grpc.intercept_channel(channel, *interceptors)
    return channel
