"""The grpc.aio multicallables behind ``waypost.aio.dial``: one per method and call kind, holding what
every call of that method shares (its method config, the per-backend grpc.aio multicallables, the
outcome report), and making the call objects of ``aio_calls``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .. import metrics as _metrics
from ..balancer.base import Outcome, PickInfo, PickResult
from ..balancer.hashkey import current_hash_key
from ..retry import AsyncReplay, Replay, WriteReplay
from .aio_calls import StreamStreamCall, StreamUnaryCall, UnaryStreamCall, UnaryUnaryCall
from .subconn import SubConn

if TYPE_CHECKING:
    from ..aio import Channel

_perf = time.perf_counter
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class _Method:
    _kind = ""

    def __init__(self, channel: Channel, method: str, ser: Any, deser: Any, registered: Any) -> None:
        self._ch = channel
        self._b = channel._balancer
        self._method = method
        self._ser = ser
        self._deser = deser
        self._registered = registered
        self._key = (self._kind, method, ser, deser)
        self._info = PickInfo(method)
        mc = channel._config.method_config(method)
        self._timeout = mc.timeout if mc is not None else None
        self._wfr = mc.wait_for_ready if mc is not None else None
        self._retry = mc.retry_policy if mc is not None else None
        self._throttle = channel._config.throttle
        self._rng = channel._config.rng

    def _inner(self, sc: SubConn) -> Any:
        mc = sc.mcs.get(self._key)
        if mc is None:
            mc = getattr(sc.channel, self._kind)(self._method, request_serializer=self._ser,
                                                 response_deserializer=self._deser,
                                                 _registered_method=self._registered)
            sc.mcs[self._key] = mc
        return mc

    def _pick_info(self, metadata: Any) -> PickInfo:
        hk = current_hash_key()
        if hk is None and not metadata:
            return self._info
        return PickInfo(self._method, hk, tuple(metadata or ()))

    def _finish(self, res: PickResult, sc: SubConn, t0: float, code: grpc.StatusCode) -> None:
        sc.inflight -= 1
        latency = _perf() - t0
        res.done(Outcome(code, latency))
        obs = _metrics.current
        if obs is not None:
            obs.call_done(self._b.target, sc.address, code, latency)
        if code is _UNAVAILABLE:
            self._b.call_failed(sc, code)


def _requests(request_iterator: Any) -> dict[str, Any]:
    """How a client-streaming call's requests are kept for replay into a retry (sync or async iterator, or
    the write API when there is no iterator)."""
    if request_iterator is None:
        return {"writes": WriteReplay()}
    if hasattr(request_iterator, "__aiter__"):
        return {"replay": AsyncReplay(request_iterator)}
    return {"replay": Replay(request_iterator)}


class UnaryUnaryMultiCallable(_Method, grpc.aio.UnaryUnaryMultiCallable):
    _kind = "unary_unary"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryUnaryCall:
        return UnaryUnaryCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_Method, grpc.aio.UnaryStreamMultiCallable):
    _kind = "unary_stream"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryStreamCall:
        return UnaryStreamCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class StreamUnaryMultiCallable(_Method, grpc.aio.StreamUnaryMultiCallable):
    _kind = "stream_unary"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamUnaryCall:
        return StreamUnaryCall(self, None, timeout, metadata, credentials, wait_for_ready, compression,
                               **_requests(request_iterator))


class StreamStreamMultiCallable(_Method, grpc.aio.StreamStreamMultiCallable):
    _kind = "stream_stream"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamStreamCall:
        return StreamStreamCall(self, None, timeout, metadata, credentials, wait_for_ready, compression,
                                **_requests(request_iterator))
