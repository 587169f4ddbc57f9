"""The sync stream-response multicallables (unary_stream, stream_stream) behind ``waypost.dial``: the call object
is the response iterator; an attempt is retried on another backend only before its first response message
(``retrying_stream``).

The unary-response kinds are in ``sync_unary_calls``; what every multicallable shares (the pick, the outcome
report) in ``method``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

import grpc

from ..balancer.failure import pushback_of
from ..types import CallMetadata
from .hedging_sync import hedged_stream
from .method import Attempt, BalancedChannel, MethodBase, trailers_of
from .replay import Replay
from .retrying_stream import RetryingStream
from .rpcerror import BalancerRpcError

_UNKNOWN = grpc.StatusCode.UNKNOWN


class _StreamResponseMethod(MethodBase[BalancedChannel]):
    """unary_stream and stream_stream: the call object is the response iterator."""

    def __call__(self, request: Any, timeout: float | None = None, metadata: CallMetadata | None = None,
                 credentials: grpc.CallCredentials | None = None,
                 wait_for_ready: bool | None = None, compression: grpc.Compression | None = None) -> Any:
        return self.started_call(lambda: self._call(request, timeout, metadata, credentials, wait_for_ready,
                                                    compression))

    def _call(self, request: Any, timeout: float | None, metadata: CallMetadata | None,
              credentials: grpc.CallCredentials | None,
              wait_for_ready: bool | None, compression: grpc.Compression | None) -> Any:
        deadline, wfr = self.settings(timeout, wait_for_ready)
        if self.hedging is not None:
            try:
                return hedged_stream(self, request, deadline, metadata, credentials, wfr, compression)
            except grpc.RpcError as e:  # no backend at all: return the failed call, as grpc does
                return e
        # Without a retry policy a client stream runs as one attempt: its requests may be consumed already when
        # it fails. A unary request is re-picked when its attempt never reached a server (transparent retry).
        if self.retry_policy is None and self._kind == "stream_stream":
            try:
                a = self.begin(metadata, deadline, None, wfr, wait=True)
            except BalancerRpcError as e:
                return e  # like grpc: the failed call is returned and raises when iterated
            return self._start(a, request, metadata, credentials, wfr, compression)
        st = self.retry_state(deadline)
        replay = Replay(request) if self._kind == "stream_stream" else None

        def start() -> Any:
            a = self.begin(metadata, deadline, st.tried, wfr, wait=True)
            req = request if replay is None else replay.attempt()
            return self._start(a, req, st.metadata(metadata), credentials, wfr, compression)

        def retry_delay(e: grpc.RpcError) -> float | None:
            if replay is not None and not replay.replayable:
                return None
            return st.after_failure(e.code(), e.details(), pushback_of(trailers_of(e)))

        try:
            # a retry starts while the caller iterates: in the call's context all the same (its hash key, its span)
            return RetryingStream(functools.partial(contextvars.copy_context().run, start), retry_delay)
        except grpc.RpcError as e:  # no backend at all: return the failed call, as grpc does
            return e

    def _start(self, a: Attempt, request: Any, metadata: CallMetadata | None,
               credentials: grpc.CallCredentials | None, wfr: bool | None,
               compression: grpc.Compression | None) -> Any:
        res, sc, mc, t0, timeout = a
        try:
            call = mc(request, timeout, metadata, credentials, None, compression)  # wfr: see MethodBase.begin
        except BaseException:
            self.finish(res, sc, t0, _UNKNOWN)
            raise
        call.add_done_callback(lambda c: self.finish(res, sc, t0, c.code(), c))
        return call


class UnaryStreamMultiCallable(_StreamResponseMethod, grpc.UnaryStreamMultiCallable):
    _kind = "unary_stream"


class StreamStreamMultiCallable(_StreamResponseMethod, grpc.StreamStreamMultiCallable):
    _kind = "stream_stream"
