"""The one place waypost touches grpcio internals. Everything else uses grpcio's public API.

Each name below says what it reads, why the public API is not enough, and what waypost does when a grpcio
release no longer has it (every fallback keeps calls correct; only speed or a retry nuance is lost).
Checked against grpcio 1.82.1 (the oldest release waypost supports: docs/compatibility.md) and 1.85; CI runs
tests/project/test_grpc_private.py, which forces every fallback, on both.

``PLAIN_UNARY_UNARY_CALL``
    ``grpc.aio._call.UnaryUnaryCall``: grpc.aio's own unary-unary call class (what a channel without
    interceptors returns). The balanced unary-unary call runs its first attempt without a task of its own
    only on this exact class, whose done callbacks run before its awaiters wake up (an interceptor's call
    object does not promise that). Missing: None, and every call takes the task path (slower, same result).

``status_of(call)``
    ``call._cython_call._status`` (a ``cygrpc.AioRpcStatus``, set once the call has ended) mapped through
    ``grpc._common.CYGRPC_STATUS_CODE_TO_STATUS_CODE``: a finished call's status, read synchronously (a done
    callback cannot await ``call.code()``). Missing: None, and the caller steps the public ``code()`` and
    ``details()`` coroutines instead (they return at once when the status is in; a little slower).

``locally_cancelled(call)``
    ``call._cython_call.is_locally_cancelled()``: the call was cancelled on this side (by its user or by
    grpc.aio), which the status alone does not tell apart from a CANCELLED sent by the server; a local
    cancel is never retried. Missing: False, and such a call's CANCELLED status goes to the retry policy
    (the default policies do not retry CANCELLED).

``EXECUTE_BATCH_ERROR``
    ``grpc._cython.cygrpc.ExecuteBatchError``: what a ``write()`` on a grpc.aio call raises when the call
    ends while the message is being sent (grpc.aio does not turn it into an ``AioRpcError``). The client
    streaming replay treats it as "this attempt is over". Missing: ``grpc.aio.AioRpcError`` (already caught
    there), so nothing extra is caught.

``registered_method_kwargs(flag)``
    The private ``_registered_method`` keyword of a channel's method factories (``unary_unary`` ...), which
    generated stubs of newer grpcio-tools pass and which lets grpcio skip a per-call method-name lookup.
    Older grpcio releases (1.60 among them) do not accept it. Missing: {} (the keyword is not forwarded; calls are the same).

``prepend_server_interceptor(server, interceptor, keep)``
    ``server._state.interceptor_pipeline`` of a ``grpc.server`` (and ``grpc._interceptor.service_pipeline``,
    which builds one): grpcio has no public way to add an interceptor to a server that already exists, and
    ``serve()`` receives servers the application created. Missing: returns None, and the caller says so (the
    load reports then carry CPU and the application's value only).

``connectivity_probe(channel)``
    ``channel._channel.check_connectivity_state`` of a sync ``grpc.Channel``: the call grpc's own ``subscribe()``
    polls with, bound once per backend, so the sync channels' one watcher thread reads every backend's state
    (and asks an idle one to connect) without a thread or a Python frame per backend. Missing:
    ``subscribed_probe(channel)``, which follows the state through the public ``subscribe()`` (one grpcio
    polling thread per backend channel: slower, same states).

``observability_plugin_active()``
    ``grpc._observability.get_plugin()``: whether grpcio's own OpenTelemetry plugin is registered, so that
    ``waypost.otel`` leaves gRPC's per-call metric names to it. Missing: False.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

import grpc
import grpc.aio

try:
    from grpc._common import CYGRPC_STATUS_CODE_TO_STATUS_CODE as _CODE_OF
except ImportError:  # pragma: no cover
    _CODE_OF = {}

try:
    from grpc._cython import cygrpc as _cygrpc
except ImportError:  # pragma: no cover
    _cygrpc = None

_I = TypeVar("_I")

PLAIN_UNARY_UNARY_CALL: type | None = getattr(getattr(grpc.aio, "_call", None), "UnaryUnaryCall", None)

EXECUTE_BATCH_ERROR: type[BaseException] = getattr(_cygrpc, "ExecuteBatchError", grpc.aio.AioRpcError)


_TAKES_REGISTERED_METHOD = "_registered_method" in inspect.signature(grpc.Channel.unary_unary).parameters


def registered_method_kwargs(flag: object) -> dict[str, object]:
    """The keyword arguments that forward a stub's ``_registered_method`` to a backend channel, if grpcio takes it."""
    return {"_registered_method": flag} if _TAKES_REGISTERED_METHOD else {}


def status_of(call: object) -> tuple[grpc.StatusCode, str] | None:
    """A finished grpc.aio call's (code, details), read synchronously; None if it has not ended, or if this
    grpcio keeps it elsewhere. Runs once per call: kept to a few attribute reads."""
    status = getattr(getattr(call, "_cython_call", None), "_status", None)
    if status is None:
        return None
    code = _CODE_OF.get(status.code())
    if code is None:
        return None
    return code, status.details()


def locally_cancelled(call: object) -> bool:
    """The grpc.aio call was cancelled on this side (False when this grpcio cannot tell)."""
    cy = getattr(call, "_cython_call", None)
    if cy is not None and hasattr(cy, "is_locally_cancelled"):
        return bool(cy.is_locally_cancelled())
    return False


def prepend_server_interceptor(server: grpc.Server, interceptor: _I, keep: type[_I]) -> _I | None:
    """Put ``interceptor`` first in a ``grpc.server``'s pipeline, keeping the application's interceptors.

    An interceptor of type ``keep`` already in the pipeline wins (returned, nothing added). Returns the
    interceptor in place, or None when this grpcio keeps its pipeline elsewhere (nothing changed)."""
    state = getattr(server, "_state", None)
    if state is None or not hasattr(state, "interceptor_pipeline"):
        return None
    try:
        from grpc import _interceptor  # the pipeline grpc.server(interceptors=...) builds
    except ImportError:  # pragma: no cover
        return None
    existing = tuple(getattr(state.interceptor_pipeline, "interceptors", ()) or ())
    for i in existing:
        if isinstance(i, keep):
            return i
    state.interceptor_pipeline = _interceptor.service_pipeline((interceptor, *existing))
    return interceptor


def connectivity_probe(channel: grpc.Channel) -> Callable[[bool], int]:
    """``probe(try_to_connect)`` -> the sync backend channel's connectivity (grpc core's state number)."""
    check = getattr(getattr(channel, "_channel", None), "check_connectivity_state", None)
    if check is None:
        return subscribed_probe(channel)
    return check  # type: ignore[no-any-return]


def subscribed_probe(channel: grpc.Channel) -> Callable[[bool], int]:
    """``connectivity_probe`` through grpcio's public ``subscribe()``: the last state it delivered; asked to
    connect while IDLE, it subscribes once more with ``try_to_connect`` (grpcio then connects) and leaves again."""
    idle = grpc.ChannelConnectivity.IDLE.value[0]
    last = [idle]

    def changed(state: grpc.ChannelConnectivity) -> None:
        last[0] = state.value[0]

    def nudge(_state: grpc.ChannelConnectivity) -> None:
        pass

    channel.subscribe(changed, try_to_connect=True)

    def probe(try_to_connect: bool) -> int:
        state = last[0]
        if try_to_connect and state == idle:
            channel.subscribe(nudge, try_to_connect=True)
            channel.unsubscribe(nudge)
        return state

    return probe


def observability_plugin_active() -> bool:
    """True while grpcio's own OpenTelemetry plugin (``grpc_observability``) is registered process-wide: it keeps
    it in ``grpc._observability`` (grpcio >= 1.62); False on a grpcio without that module."""
    try:
        from grpc import _observability
    except ImportError:
        return False
    get = getattr(_observability, "get_plugin", None)
    if get is None:
        return False
    with get() as plugin:
        return plugin is not None
