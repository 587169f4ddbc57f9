"""OpenTelemetry metrics and traces (``pip install 'waypost[otel]'``: the API; the application installs and
configures the SDK and its exporters).

Off by default, and then free: the call path reads ``waypost.otel.hooks.current``, None until :func:`enable`.

    from opentelemetry import metrics, trace
    ...  # set the SDK's MeterProvider and TracerProvider (and their exporters) as usual
    waypost.otel.enable()

What it records (names and attributes: docs/observability.md, and ``waypost.otel.sink.NAMES``):

- traces: a ``Sent.<service>.<method>`` span per call, an ``Attempt.<service>.<method>`` child per attempt (its
  backend, the policy, its kind (first, retry, hedge) and why it was made), the attempt's trace context sent in its
  metadata; ``waypost.serve`` makes the server's handler span (``Recv.<service>.<method>``) a child of it;
- metrics: gRPC's per-call client metrics (gRFC A66: ``grpc.client.attempt.started``, ``...attempt.duration``,
  ``grpc.client.call.duration``; A96: ``grpc.client.call.retries``) for waypost's balanced calls, and waypost's own
  (``waypost.*``: picks per backend, retries and hedges by outcome, ejections, resolver updates, the registry
  connection, xDS pushes, NACKs and connected clients): the same events as ``waypost.metrics``' Prometheus ones.

Next to grpcio's own OpenTelemetry plugin (``grpc_observability``): grpcio records ``grpc.client.*`` for each
backend channel (``grpc.target`` = one backend's address; one of its "calls" is one waypost attempt), so waypost
then leaves the ``grpc.client.*`` names to it (``grpc_metrics=None``, the default, decides from whether the plugin
is registered when ``enable`` runs) and records only ``waypost.*``: nothing is counted twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, overload

from .. import metrics
from . import hooks

if TYPE_CHECKING:
    import grpc
    import grpc.aio
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

    from .server import AsyncTraceInterceptor, TraceInterceptor
    from .sink import OtelSink

log = logging.getLogger("waypost.otel")

__all__ = ["disable", "enable", "enabled", "server_interceptor"]

_lock = threading.Lock()
_sink: OtelSink | None = None
_tracer: Tracer | None = None


def _import_api() -> None:
    try:
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise ImportError(
            "waypost.otel needs the OpenTelemetry API: install the extra with  pip install 'waypost[otel]'"
            " (and opentelemetry-sdk with an exporter to send what it records)") from None


def enable(*, meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None,
           metrics_on: bool = True,
           tracing: bool = True, grpc_metrics: bool | None = None) -> None:
    """Record waypost's metrics and traces with OpenTelemetry.

    ``meter_provider`` / ``tracer_provider``: the SDK's providers (default: the global ones the application set).
    ``metrics_on`` / ``tracing``: turn either off. ``grpc_metrics``: also record gRPC's per-call client metrics
    (``grpc.client.*``) for waypost's balanced calls; None (default): yes unless grpcio's own OpenTelemetry plugin
    is registered (it records them per backend channel). Calling again replaces the previous settings.
    Raises ImportError naming the ``waypost[otel]`` extra when the OpenTelemetry API is not installed.
    """
    _import_api()
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace

    from .._grpc_private import observability_plugin_active
    from .client import Telemetry
    from .sink import OtelSink

    global _sink, _tracer
    if grpc_metrics is None:
        grpc_metrics = not observability_plugin_active()
    with _lock:
        _disable_locked()
        if metrics_on:
            meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter("waypost")
            _sink = OtelSink(meter, grpc_metrics)
            metrics.attach_sink(_sink)
        if tracing:
            _tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("waypost")
        hooks.current = Telemetry(_tracer, _sink) if (_sink is not None or _tracer is not None) else None
    log.info("waypost OpenTelemetry enabled (metrics=%s, grpc.client.* metrics=%s, tracing=%s)",
             metrics_on, grpc_metrics and metrics_on, tracing)


def _disable_locked() -> None:
    global _sink, _tracer
    hooks.current = None
    if _sink is not None:
        metrics.detach_sink(_sink)
    _sink = _tracer = None


def disable() -> None:
    """Stop recording (the hooks become no-ops again)."""
    with _lock:
        _disable_locked()


def enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return hooks.current is not None


@overload
def server_interceptor(aio: Literal[False] = False, tracer_provider: TracerProvider | None = None
                       ) -> TraceInterceptor: ...
@overload
def server_interceptor(aio: Literal[True], tracer_provider: TracerProvider | None = None
                       ) -> AsyncTraceInterceptor: ...
@overload
def server_interceptor(aio: bool, tracer_provider: TracerProvider | None = None
                       ) -> TraceInterceptor | AsyncTraceInterceptor: ...
def server_interceptor(aio: bool = False, tracer_provider: TracerProvider | None = None
                       ) -> TraceInterceptor | AsyncTraceInterceptor:
    """An interceptor that joins each call's server span to the client's trace, for ``grpc.server(interceptors=)``
    or, ``aio=True``, ``grpc.aio.server(interceptors=)`` (``waypost.serve`` adds one to a ``grpc.server`` itself).

    Its spans go to ``tracer_provider``; by default to the one :func:`enable` was given, else to the global one
    (looked up at each call, so the interceptor may be made before ``enable``)."""
    _import_api()
    from .server import AsyncTraceInterceptor, TraceInterceptor

    if tracer_provider is not None:
        fixed = tracer_provider.get_tracer("waypost")
        source: Callable[[], Tracer] = lambda: fixed
    else:
        source = _current_tracer
    return AsyncTraceInterceptor(source) if aio else TraceInterceptor(source)


def _current_tracer() -> Tracer:
    from opentelemetry import trace

    return _tracer if _tracer is not None else trace.get_tracer_provider().get_tracer("waypost")


def mount_server(server: grpc.Server | grpc.aio.Server) -> None:
    """What ``waypost.serve`` calls on a server before it starts: the trace interceptor while tracing is on."""
    if _tracer is not None:
        from .server import mount

        mount(server, _current_tracer)
