"""The client's telemetry: a span per call, a child span per attempt (retries and hedges included) naming the
backend, the policy and why the attempt was made, the trace context sent to the backend in the attempt's metadata
(OpenTelemetry's configured propagators), and the per-call and per-attempt metrics (``sink.OtelSink``).

Span names are gRPC's (gRFC A72): ``Sent.<service>.<method>`` for a call, ``Attempt.<service>.<method>`` for each
attempt; the server's is ``Recv.<service>.<method>`` (``waypost.otel.server``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from ..redaction import RedactedTargets
from .hooks import CALL, AttemptStart
from .sink import OtelSink

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

T = TypeVar("T")
_OK = grpc.StatusCode.OK
_UNKNOWN = grpc.StatusCode.UNKNOWN
_perf = time.perf_counter


def span_name(prefix: str, method: str) -> str:
    """gRPC's span name for ``method`` (``/pkg.Service/Method``): ``prefix.pkg.Service.Method`` (A72)."""
    return f"{prefix}.{method.lstrip('/').replace('/', '.')}"


def method_attribute(method: str) -> str:
    """``grpc.method`` of A66: the full method name without its leading slash (``pkg.Service/Method``)."""
    return method.lstrip("/")


def rpc_attributes(method: str) -> dict[str, str]:
    """OpenTelemetry's RPC attributes of ``method`` (``rpc.system``, ``rpc.service``, ``rpc.method``)."""
    service, _, name = method.lstrip("/").rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    """A finished call's status: a sync call or error, or a grpc.aio call (its coroutines return at once once it
    has ended); UNKNOWN when it cannot be read."""
    out: list[Any] = []
    for name in ("code", "details"):
        get = getattr(call, name, None)
        if get is None:
            return _UNKNOWN, ""
        try:
            value = get()
            if hasattr(value, "send"):  # a coroutine: finished calls answer without suspending
                try:
                    value.send(None)
                except StopIteration as e:
                    value = e.value
                else:
                    value.close()
                    return _UNKNOWN, ""
        except Exception:  # noqa: BLE001  # a call that has no status to give
            return _UNKNOWN, ""
        out.append(value)
    code = out[0] if isinstance(out[0], grpc.StatusCode) else _UNKNOWN
    return code, out[1] or ""


class _Call:
    """One call: its span (or None without tracing), what its attempts were, and its end (exactly once)."""

    __slots__ = ("attempts", "context", "ended", "last_code", "lock", "method", "retries", "span", "t0", "target",
                 "tel")

    def __init__(self, tel: Telemetry, method: str, target: str) -> None:
        self.tel = tel
        self.method = method
        self.target = target
        self.attempts = 0
        self.retries = 0  # retries and hedges (every attempt after the first)
        self.last_code: grpc.StatusCode | None = None  # of the last attempt that ended
        self.ended = False
        self.lock = threading.Lock()
        self.t0 = _perf()
        self.span: Span | None = None
        self.context: Any = None
        tracer = tel.tracer
        if tracer is not None:
            from opentelemetry import trace

            self.span = tracer.start_span(span_name("Sent", method), kind=trace.SpanKind.CLIENT,
                                          attributes={**rpc_attributes(method), "grpc.target": target})
            self.context = trace.set_span_in_context(self.span)

    def end(self, code: grpc.StatusCode, details: str = "") -> None:
        with self.lock:
            if self.ended:
                return
            self.ended = True
        sink = self.tel.sink
        if sink is not None:
            sink.call_ended(method_attribute(self.method), self.target, code, _perf() - self.t0, self.retries)
        span = self.span
        if span is not None:
            _end_span(span, code, details, {"waypost.attempts": self.attempts})


class _Attempt:
    """One attempt (``hooks.AttemptEnd``): its span, kind and call."""

    __slots__ = ("call", "kind", "method", "span", "target", "tel")

    def __init__(self, tel: Telemetry, call: _Call | None, method: str, target: str, kind: str, span: Any) -> None:
        self.tel = tel
        self.call = call
        self.method = method
        self.target = target
        self.kind = kind
        self.span = span

    def ended(self, code: grpc.StatusCode, latency: float, call: Any) -> None:
        sink = self.tel.sink
        if sink is not None:
            sink.attempt_ended(method_attribute(self.method), self.target, code, latency, self.kind)
        if self.call is not None:
            self.call.last_code = code
        if self.span is not None:
            details = status_of(call)[1] if call is not None and code is not _OK else ""
            _end_span(self.span, code, details, {})


def _end_span(span: Span, code: grpc.StatusCode, details: str, attributes: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.grpc.status_code", code.value[0])
    for k, v in attributes.items():
        span.set_attribute(k, v)
    if code is not _OK:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}" if details else code.name))
    span.end()


class Injecting:
    """A backend multicallable whose calls also send ``headers`` (the attempt's trace context) in their metadata;
    the metadata is the third positional argument of grpc's sync calls and the ``metadata`` keyword of grpc.aio's."""

    __slots__ = ("headers", "mc")

    def __init__(self, mc: Any, headers: Sequence[tuple[str, str]]) -> None:
        self.mc = mc
        self.headers = tuple(headers)

    def _with(self, args: tuple[Any, ...], kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if len(args) >= 3:
            return (*args[:2], (*(args[2] or ()), *self.headers), *args[3:]), kw
        return args, {**kw, "metadata": (*(kw.get("metadata") or ()), *self.headers)}

    def __call__(self, *args: Any, **kw: Any) -> Any:
        args, kw = self._with(args, kw)
        return self.mc(*args, **kw)

    def with_call(self, *args: Any, **kw: Any) -> Any:
        args, kw = self._with(args, kw)
        return self.mc.with_call(*args, **kw)

    def future(self, *args: Any, **kw: Any) -> Any:
        args, kw = self._with(args, kw)
        return self.mc.future(*args, **kw)


class Telemetry:
    """The client hooks (``hooks.ClientTelemetry``): ``tracer`` (None: no spans) and ``sink`` (None: no
    metrics)."""

    def __init__(self, tracer: Tracer | None, sink: OtelSink | None) -> None:
        self.tracer = tracer
        self.sink = sink
        self._targets = RedactedTargets()

    def _target(self, balancer: Any) -> str:
        return self._targets[balancer.target]

    def _run_as_call(self, method: str, balancer: Any, fn: Callable[[], T]) -> tuple[_Call, T]:
        """``fn()`` with a new call current; the call ends here only when ``fn`` raises."""
        call = _Call(self, method, self._target(balancer))
        token = CALL.set(call)
        try:
            return call, fn()
        except grpc.RpcError as e:
            call.end(*status_of(e))
            raise
        except BaseException:
            call.end(_UNKNOWN)
            raise
        finally:
            CALL.reset(token)

    def blocking_call(self, method: str, balancer: Any, run: Callable[[], T]) -> T:
        """Run a blocking call (``run``: its attempts) as one call: its span current while it runs."""
        call, out = self._run_as_call(method, balancer, run)
        call.end(_OK)
        return out

    def started_call(self, method: str, balancer: Any, start: Callable[[], T]) -> T:
        """Start a call that goes on after ``start`` returns its call object (a response stream, a future, a
        grpc.aio call): its attempts started now or later (tasks copy the context) belong to it; it ends when the
        call object's done callbacks run."""
        call, obj = self._run_as_call(method, balancer, start)
        add = getattr(obj, "add_done_callback", None)
        if add is None:  # a failed call returned as the call object (grpc's way for streams)
            call.end(*status_of(obj))
        else:
            add(lambda c: call.end(*status_of(c)))
        return obj

    def attempt_begun(self, method: str, balancer: Any, address: str, mc: Any, t0: float, hedged: bool
                      ) -> tuple[AttemptStart, Any]:
        """An attempt of ``method`` picked ``address``: its span (a child of the call's), the trace context its
        metadata carries (``Injecting``), the pick counted. Returns (start time, multicallable to call)."""
        target = self._target(balancer)
        call: _Call | None = CALL.get()
        kind, reason = "first", ""
        if call is not None:
            with call.lock:
                n = call.attempts
                call.attempts = n + 1
                if n:
                    call.retries += 1
                last = call.last_code
            if n:
                kind = "hedge" if hedged else "retry"
                reason = f"previous attempt {last.name}" if last is not None else "hedging delay"
        sink = self.sink
        if sink is not None:
            sink.attempt_started(method_attribute(method), target, address)
        span = None
        tracer = self.tracer
        if tracer is not None:
            from opentelemetry import propagate, trace

            attributes: dict[str, Any] = {**rpc_attributes(method), "grpc.target": target,
                                          "waypost.backend": address, "waypost.lb.policy": balancer.policy.name,
                                          "waypost.attempt.kind": kind}
            host, _, port = address.rpartition(":")
            if port.isdigit():
                attributes["server.address"] = host.strip("[]")
                attributes["server.port"] = int(port)
            if call is not None:
                attributes["grpc.previous_rpc_attempts"] = call.attempts - 1
            if reason:
                attributes["waypost.attempt.reason"] = reason
            parent = call.context if call is not None else None
            span = tracer.start_span(span_name("Attempt", method), context=parent, kind=trace.SpanKind.CLIENT,
                                     attributes=attributes)
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span))
            if carrier:
                mc = Injecting(mc, sorted(carrier.items()))
        return AttemptStart(t0, _Attempt(self, call, method, target, kind, span)), mc
