"""What a balanced multicallable knows about its method, shared by the sync (``waypost.channel``) and
grpc.aio (``waypost.client.aio_methods``) channels: the method config, the per-backend multicallable
cache, the pick info, and the outcome report at the end of an attempt."""

from __future__ import annotations

import time
from typing import Any

import grpc

from .. import metrics as _metrics
from ..balancer.base import Outcome, PickInfo, PickResult, _noop_done
from .hashkey import current_hash_key
from .subconn import SubConn

_perf = time.perf_counter
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class MethodBase:
    """One method of one balanced channel; subclasses set ``_kind`` (the grpc channel method name)."""

    _kind = ""

    def __init__(self, channel: Any, method: str, request_serializer: Any, response_deserializer: Any,
                 registered: Any) -> None:
        self._channel = channel
        self._b = channel._balancer
        self._method = method
        self._ser = request_serializer
        self._deser = response_deserializer
        self._registered = registered
        self._key = (self._kind, method, request_serializer, response_deserializer)
        self._info = PickInfo(method)
        mc = channel._config.method_config(method)
        self._timeout = mc.timeout if mc is not None else None
        self._wfr = mc.wait_for_ready if mc is not None else None
        self._retry = mc.retry_policy if mc is not None else None
        self._throttle = channel._config.throttle
        self._rng = channel._config.rng

    def _inner(self, sc: SubConn) -> Any:
        """The backend channel's own multicallable for this method (made once per backend)."""
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
        """An attempt on ``sc`` ended with ``code``: tell the picker and the metrics (and the balancer,
        on UNAVAILABLE: it re-checks that backend's connection)."""
        sc.inflight -= 1
        latency = _perf() - t0
        done = res.done
        if done is not _noop_done:  # most pickers keep no per-call state: no Outcome to build for them
            done(Outcome(code, latency))
        obs = _metrics.current
        if obs is not None:
            obs.call_done(self._b.target, sc.address, code, latency)
        if code is _UNAVAILABLE:
            self._b.call_failed(sc, code)
