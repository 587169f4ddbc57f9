"""What a balanced multicallable knows about its method, shared by the sync (``sync_unary_calls``,
``sync_stream_calls``) and grpc.aio (``aio_unary_calls``, ``aio_stream_calls``) multicallables: the method
config, the per-backend multicallable cache, and the two ends of every attempt: ``begin`` (the pick, the call
counted in flight on its backend, the start time) and ``finish`` (the outcome to the picker, the metrics and
the balancer). Also the four multicallable makers both channels share (``MulticallableFactory``).

A multicallable sees its channel only through ``BalancedChannel``: the balancer wrapper, the picker
wrapper and the channel config (and, for grpc.aio, the ``AioPickWaiter``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, overload

import grpc
import grpc.aio

from .. import metrics as _metrics
from .._grpc_private import registered_method_kwargs
from ..balancer.base import Outcome, PickError, PickInfo, PickResult, noop_done
from ..balancer.failure import pushback_of
from ..otel import hooks as _otel
from ..types import CallMetadata
from .aio_wait import AioPickWaiter
from .balancer_wrapper import BalancerWrapper
from .channel_config import ChannelConfig
from .explain import explain, with_explanation
from .hashkey import HASH_KEY
from .picker_wrapper import PickerWrapper
from .retry import RetryState
from .rpcerror import BalancerRpcError, ExplainedRpcError
from .subconn import SubConn

_perf = time.perf_counter
_mono = time.monotonic
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_OK = grpc.StatusCode.OK

#: how a stub turns its request message into bytes, and a response's bytes into its message (grpc's own types)
RequestSerializer = Callable[[Any], bytes]
ResponseDeserializer = Callable[[bytes], Any]

#: A started attempt, from ``MethodBase.begin``: (pick result, subconn, the backend's multicallable, start time
#: (``perf_counter``), the attempt's timeout: what is left of the call's deadline, or None).
Attempt = tuple[PickResult, SubConn, Any, float, "float | None"]


class BalancedChannel(Protocol):
    """What a multicallable uses of its channel (both ``waypost.channel.Channel`` and
    ``waypost.aio.Channel`` provide it)."""

    @property
    def balancer(self) -> BalancerWrapper: ...

    @property
    def pickers(self) -> PickerWrapper: ...

    @property
    def config(self) -> ChannelConfig: ...


class AsyncBalancedChannel(BalancedChannel, Protocol):
    """The aio channel adds its change event and the awaitable slow path of a pick (``AioPickWaiter``)."""

    @property
    def waiter(self) -> AioPickWaiter: ...


ChannelT = TypeVar("ChannelT", bound=BalancedChannel)
T = TypeVar("T")


class MethodBase(Generic[ChannelT]):
    """One method of one balanced channel; subclasses set ``_kind`` (the grpc channel method name).

    Public for the call objects that run attempts: ``channel``, ``balancer``, ``pickers``, the method
    config's ``timeout``, ``wait_for_ready``, ``retry_policy`` and ``hedging``, the channel's retry ``throttle`` and
    ``rng``, and ``settings``, ``pick_info``, ``begin``, ``inner``, ``finish``.
    """

    _kind = ""

    def __init__(self, channel: ChannelT, method: str, request_serializer: RequestSerializer | None,
                 response_deserializer: ResponseDeserializer | None, registered: object) -> None:
        self.channel = channel
        self.balancer = channel.balancer
        self.pickers = channel.pickers
        self._method = method
        self._ser = request_serializer
        self._deser = response_deserializer
        self._registered = registered
        self._key = (self._kind, method, request_serializer, response_deserializer)
        self._info = PickInfo(method)
        config = channel.config
        mc = config.method_config(method)
        self.timeout = mc.timeout if mc is not None else None
        self.wait_for_ready = mc.wait_for_ready if mc is not None else None
        self.retry_policy = mc.retry_policy if mc is not None else None
        # hedged: unary and server-streaming methods with a hedgingPolicy (a client stream would have to be fed to
        # several attempts at once: not hedged)
        self.hedging = config.hedging.for_method(method, mc.hedging_policy) if mc is not None and \
            self._kind in ("unary_unary", "unary_stream") else None
        self.throttle = config.throttle
        self.rng = config.rng

    def inner(self, sc: SubConn) -> Any:
        """The backend channel's own multicallable for this method (made once per backend)."""
        mc = sc.mcs.get(self._key)
        if mc is None:
            mc = getattr(sc.channel, self._kind)(self._method, request_serializer=self._ser,
                                                 response_deserializer=self._deser,
                                                 **registered_method_kwargs(self._registered))
            sc.mcs[self._key] = mc
        return mc

    def settings(self, timeout: float | None, wait_for_ready: bool | None) -> tuple[float | None,
                 bool | None]:
        """A call's deadline (``time.monotonic``; None: no deadline) and wait_for_ready: the call's own, else
        the method config's."""
        if timeout is None:
            timeout = self.timeout
        if wait_for_ready is None:
            wait_for_ready = self.wait_for_ready
        return (None if timeout is None else _mono() + timeout), wait_for_ready

    def pick_info(self, metadata: CallMetadata | None) -> PickInfo:
        """What the picker sees of this call: the method, the hash key in context (``hashkey``), the metadata."""
        hk = HASH_KEY.get()
        if hk is None and not metadata:
            return self._info
        return PickInfo(self._method, hk, tuple(metadata or ()))

    def retry_state(self, deadline: float | None, first: str | None = None) -> RetryState:
        """The retry bookkeeping of one call of this method (``first``: see ``RetryState``)."""
        return RetryState(self.retry_policy, self.throttle, self.rng, deadline, first)

    @overload
    def begin(self, metadata: CallMetadata | None, deadline: float | None, tried: set[str] | None = None,
              wfr: bool | None = None,
              *, wait: Literal[True], picked: tuple[PickResult, SubConn] | None = None) -> Attempt: ...

    @overload
    def begin(self, metadata: CallMetadata | None, deadline: float | None, tried: set[str] | None = None,
              wfr: bool | None = None,
              *, wait: bool = False, picked: tuple[PickResult, SubConn]) -> Attempt: ...

    @overload
    def begin(self, metadata: CallMetadata | None, deadline: float | None, tried: set[str] | None = None,
              wfr: bool | None = None,
              *, wait: bool = False, picked: None = None) -> Attempt | None: ...

    def begin(self, metadata: CallMetadata | None, deadline: float | None, tried: set[str] | None = None,
              wfr: bool | None = None,
              *, wait: bool = False, picked: tuple[PickResult, SubConn] | None = None) -> Attempt | None:
        """Start an attempt: pick its backend, count it in flight there, note its start (``Attempt``; ``finish``
        ends it: exactly once, whatever happens to the attempt after this).

        Without a usable pick right now: with ``wait``, the calling thread waits for one here
        (``PickerWrapper.wait_pick``, bounded by ``deadline``; sync calls); otherwise None, and the caller
        waits its own way (``AioPickWaiter.wait_pick``) and calls again with the result as ``picked``.
        ``tried``: a retry's earlier backends, avoided on the waiting path (``retry.avoid_tried``); this
        attempt's backend is added. Raises BalancerRpcError when the call cannot get a backend.

        ``wfr`` (wait_for_ready) is honoured here, by the balanced channel, and never passed to the backend's own
        call: the pick waits for a usable backend, and an attempt whose backend turns out gone (it never reached
        a server: ``retry.never_sent``) is picked again. Passed down, it would wait for that one backend to come
        back until the deadline, however many others serve."""
        if picked is None:
            if not tried:  # a retry never keeps the plain pick: the waiting path avoids the backends tried
                try:
                    picked = self.pickers.pick(self.pick_info(metadata))
                except PickError as e:
                    raise BalancerRpcError(e.code, e.message) from None
            if picked is None:
                if not wait:
                    return None
                picked = self.pickers.wait_pick(self.pick_info(metadata), deadline, wfr, tried or ())
        res, sc = picked
        if tried is not None:
            tried.add(sc.address)
        mc = self.inner(sc)
        sc.inflight += 1
        t0 = _perf()
        tel = _otel.current
        if tel is not None:  # OpenTelemetry: the attempt's span, its trace context in the metadata (waypost.otel)
            t0, mc = tel.attempt_begun(self._method, self.balancer, sc.address, mc, t0, self.hedging is not None)
        return res, sc, mc, t0, None if deadline is None else max(deadline - _mono(), 0.0)

    def finish(self, res: PickResult, sc: SubConn, t0: float, code: grpc.StatusCode, call: Any = None,
               succeeded: bool = False) -> None:
        """The attempt that ``begin`` started on ``sc`` at ``t0`` ended with ``code``: count it out of flight,
        tell the picker and the metrics (and the balancer, on UNAVAILABLE: it re-checks that backend's
        connection). ``call``: the finished call or its RpcError, read for trailing metadata when the pick
        asked for them (``res.wants_trailers``) and on failures (``grpc-retry-pushback-ms``, ``Outcome.pushback``;
        failures are rare, so every call does not pay for it). ``succeeded``: this end is the call's success (``succeeded``)."""
        sc.inflight -= 1
        latency = _perf() - t0
        done = res.done
        if done is not noop_done:  # most pickers keep no per-call state: no Outcome to build for them
            trailers = trailers_of(call) if res.wants_trailers or (code is not _OK and call is not None) else None
            done(Outcome(code, latency, trailers if res.wants_trailers else None,
                         None if code is _OK else pushback_of(trailers)))
        obs = _metrics.current
        if obs is not None:
            obs.call_done(self.balancer.target, sc.address, code, latency, self._method)
        if type(t0) is not float:  # an attempt waypost.otel follows (hooks.AttemptStart)
            t0.end.ended(code, latency, call)  # type: ignore[attr-defined]
        if code is _UNAVAILABLE:
            self.balancer.call_failed(sc, code)
        elif succeeded and self.throttle is not None:
            self.succeeded()

    def blocking_call(self, run: Callable[[], T]) -> T:
        """Run a blocking call (``run``: its attempts): as one traced call while ``waypost.otel`` is on."""
        tel = _otel.current
        return run() if tel is None else tel.blocking_call(self._method, self.balancer, run)

    def started_call(self, start: Callable[[], T]) -> T:
        """Start a call that goes on after ``start`` returns its call object: as one traced call while
        ``waypost.otel`` is on (it ends with the call object's done callbacks)."""
        tel = _otel.current
        return start() if tel is None else tel.started_call(self._method, self.balancer, start)

    def succeeded(self) -> None:
        """A call of this method succeeded (a response stream: its first message came): retry throttling
        counts it (gRFC A6)."""
        throttle = self.throttle
        if throttle is not None:
            throttle.record_success()

    def explanation(self, code: grpc.StatusCode, details: str | None, sc: SubConn, probe: bool = False
                    ) -> str | None:
        """What to add to the details of a call failing for good on ``sc`` (``client.explain``), else None."""
        if self.hedging is not None and code is _UNAVAILABLE:
            return f"backend {sc.address}"  # hedged: it went to other backends already; no retries= hint
        return explain(code, details, sc.address, direct=self.channel.config.target.scheme == "direct",
                       retry_policy=self.retry_policy, probe=probe)

    def explained(self, e: grpc.RpcError, sc: SubConn) -> grpc.RpcError:
        """A sync call's final error ``e`` with the backend and the likely cause in its details (else ``e``)."""
        details = e.details()  # type: ignore[attr-defined]
        extra = self.explanation(e.code(), details, sc, probe=True)  # type: ignore[attr-defined]
        return e if extra is None else ExplainedRpcError(e, with_explanation(details, extra))

    def explained_aio(self, e: grpc.aio.AioRpcError, sc: SubConn) -> grpc.aio.AioRpcError:
        """``explained`` for grpc.aio (never blocks: no probe of the backend)."""
        extra = self.explanation(e.code(), e.details(), sc)
        if extra is None:
            return e
        return grpc.aio.AioRpcError(e.code(), e.initial_metadata(), e.trailing_metadata(),
                                    with_explanation(e.details(), extra), e.debug_error_string())


def trailers_of(call: Any) -> tuple[tuple[str, Any], ...] | None:
    """The trailing metadata of a finished call (sync call, RpcError or grpc.aio call), read without blocking;
    None when there is no call or they are not in."""
    if call is None:
        return None
    get = getattr(call, "trailing_metadata", None)
    if get is None:
        return None
    try:
        md = get()
        if hasattr(md, "send"):  # grpc.aio: a coroutine that returns at once when the call has ended
            try:
                md.send(None)
            except StopIteration as e:
                md = e.value
            else:
                md.close()
                return None
    except Exception:  # noqa: BLE001  # a call without trailers (cancelled before it started, ...)
        return None
    return tuple(md) if md else ()


class MulticallableFactory:
    """grpc's four multicallable makers, for the sync and aio channels alike: a channel names its four
    classes in ``multicallables`` (by kind: unary_unary, unary_stream, stream_unary, stream_stream)."""

    multicallables: ClassVar[Mapping[str, type[MethodBase[Any]]]]

    def _make(self, kind: str, method: str, request_serializer: RequestSerializer | None,
              response_deserializer: ResponseDeserializer | None, registered: object) -> Any:
        return self.multicallables[kind](self, method, request_serializer,  # type: ignore[call-arg,arg-type]
                                         response_deserializer, registered)

    def unary_unary(self, method: str, request_serializer: RequestSerializer | None = None,
                    response_deserializer: ResponseDeserializer | None = None,
                    _registered_method: object = False) -> Any:
        return self._make("unary_unary", method, request_serializer, response_deserializer, _registered_method)

    def unary_stream(self, method: str, request_serializer: RequestSerializer | None = None,
                     response_deserializer: ResponseDeserializer | None = None,
                     _registered_method: object = False) -> Any:
        return self._make("unary_stream", method, request_serializer, response_deserializer, _registered_method)

    def stream_unary(self, method: str, request_serializer: RequestSerializer | None = None,
                     response_deserializer: ResponseDeserializer | None = None,
                     _registered_method: object = False) -> Any:
        return self._make("stream_unary", method, request_serializer, response_deserializer, _registered_method)

    def stream_stream(self, method: str, request_serializer: RequestSerializer | None = None,
                      response_deserializer: ResponseDeserializer | None = None,
                      _registered_method: object = False) -> Any:
        return self._make("stream_stream", method, request_serializer, response_deserializer, _registered_method)


def by_kind(*classes: type[MethodBase[Any]]) -> dict[str, type[MethodBase[Any]]]:
    """``MulticallableFactory.multicallables`` from the four classes (each names its ``_kind``)."""
    return {cls._kind: cls for cls in classes}
