"""The sync unary-response multicallables (unary_unary, stream_unary) behind ``waypost.dial``: each attempt is
one blocking call on the picked backend's own multicallable, retried on another backend per the retry policy.

The stream-response kinds are in ``sync_stream_calls``; what every multicallable shares (the pick, the outcome
report) in ``method``.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from ..balancer.failure import pushback_of
from ..types import CallMetadata
from .future import ThreadFuture
from .hedging_sync import hedged_with_call
from .method import BalancedChannel, MethodBase, trailers_of
from .replay import Replay
from .retry import MAX_TRANSPARENT, RetryState
from .rpcerror import BalancerRpcError

_OK = grpc.StatusCode.OK
_UNKNOWN = grpc.StatusCode.UNKNOWN
_CANCELLED = grpc.StatusCode.CANCELLED
_mono = time.monotonic


class _UnaryRequestMethod(MethodBase[BalancedChannel]):
    """unary_unary and stream_unary: one response, so a whole attempt is one blocking inner call."""

    def __call__(self, request: Any, timeout: float | None = None, metadata: CallMetadata | None = None,
                 credentials: grpc.CallCredentials | None = None,
                 wait_for_ready: bool | None = None, compression: grpc.Compression | None = None) -> Any:
        return self.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)[0]

    def with_call(self, request: Any, timeout: float | None = None, metadata: CallMetadata | None = None,
                  credentials: grpc.CallCredentials | None = None,
                  wait_for_ready: bool | None = None,
                  compression: grpc.Compression | None = None) -> tuple[Any, grpc.Call]:
        return self.blocking_call(lambda: self._with_call(request, timeout, metadata, credentials, wait_for_ready,
                                                          compression))

    def _with_call(self, request: Any, timeout: float | None, metadata: CallMetadata | None,
                   credentials: grpc.CallCredentials | None,
                   wait_for_ready: bool | None, compression: grpc.Compression | None) -> tuple[Any,
                   grpc.Call]:
        deadline, wfr = self.settings(timeout, wait_for_ready)
        if self.hedging is not None:
            return hedged_with_call(self, request, deadline, metadata, credentials, wfr, compression)
        # Client streaming: requests are recorded for replay only when a retry policy may need them.
        replay = Replay(request) if self._kind == "stream_unary" and self.retry_policy is not None else None
        st: RetryState | None = None  # made when an attempt fails: a call that succeeds at once needs none
        md = metadata
        while True:
            res, sc, mc, t0, attempt_timeout = self.begin(metadata, deadline, None if st is None else st.tried,
                                                          wfr, wait=True)
            try:
                out = mc.with_call(request if replay is None else replay.attempt(), attempt_timeout, md,
                                   credentials, None, compression)  # wfr: see MethodBase.begin
            except grpc.RpcError as e:
                code = e.code()
                self.finish(res, sc, t0, code, e)
                if st is None:
                    st = self.retry_state(deadline, sc.address)
                delay = st.after_failure(code, e.details(), pushback_of(trailers_of(e)))
                if delay is None or (replay is not None and not replay.replayable) or (
                        replay is None and self._kind == "stream_unary"):  # consumed requests: no replay
                    explained = self.explained(e, sc)
                    if explained is e:
                        raise
                    raise explained from None
                if delay:
                    time.sleep(delay)
                md = st.metadata(metadata)
                continue
            except ValueError:
                self.finish(res, sc, t0, _CANCELLED)
                if st is None:
                    st = self.retry_state(deadline, sc.address)
                if not sc.removed or st.transparent >= MAX_TRANSPARENT:
                    raise
                st.transparent += 1  # closed under us before the call started: nothing was sent
                md = st.metadata(metadata)
                continue
            except BaseException:
                self.finish(res, sc, t0, _UNKNOWN)
                raise
            self.finish(res, sc, t0, _OK, out[1], True)
            return out  # type: ignore[no-any-return]

    def future(self, request: Any, timeout: float | None = None, metadata: CallMetadata | None = None,
               credentials: grpc.CallCredentials | None = None,
               wait_for_ready: bool | None = None,
               compression: grpc.Compression | None = None) -> grpc.Future:
        return self.started_call(lambda: self._future(request, timeout, metadata, credentials, wait_for_ready,
                                                      compression))

    def _future(self, request: Any, timeout: float | None, metadata: CallMetadata | None,
                credentials: grpc.CallCredentials | None,
                wait_for_ready: bool | None, compression: grpc.Compression | None) -> grpc.Future:
        deadline, wfr = self.settings(timeout, wait_for_ready)
        if self.retry_policy is None and self.hedging is None and not wfr:  # waiting for a backend may mean picking again: the thread
            try:
                a = self.begin(metadata, deadline)
            except BalancerRpcError as e:
                return e
            if a is not None:
                res, sc, mc, t0, attempt_timeout = a
                try:
                    fut = mc.future(request, attempt_timeout, metadata, credentials, None, compression)
                except BaseException:
                    self.finish(res, sc, t0, _UNKNOWN)
                    raise
                fut.add_done_callback(lambda c: self.finish(res, sc, t0, c.code(), c))
                return fut  # type: ignore[no-any-return]
        # Waiting for a backend, retrying or hedging would block: run the blocking call on a worker thread.
        timeout = None if deadline is None else max(deadline - _mono(), 0.0)
        return ThreadFuture(self._with_call, request, timeout, metadata, credentials, wfr, compression)


class UnaryUnaryMultiCallable(_UnaryRequestMethod, grpc.UnaryUnaryMultiCallable):
    _kind = "unary_unary"


class StreamUnaryMultiCallable(_UnaryRequestMethod, grpc.StreamUnaryMultiCallable):
    _kind = "stream_unary"
