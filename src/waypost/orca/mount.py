"""Making a server (not started yet) report its load: what ``waypost.serve``/``serve_async`` call.

``mount(server)`` mounts both waypost's own report (``waypost.load.v1``) and ORCA:

- ``grpc.server``: an ``OrcaInterceptor`` goes first in the pipeline: it accounts calls, adds the per-call trailer
  (unless turned off with ``configure(per_call=False)``) and answers both services. An interceptor already given
  to ``grpc.server(interceptors=...)`` is kept: an ``OrcaInterceptor`` as it is; a plain load interceptor gets
  the out-of-band service next to it (reports with its rates, no trailers).
- ``grpc.aio.server``: interceptors cannot be added once it exists. Created with
  ``interceptors=[waypost.orca.interceptor(aio=True)]`` it does everything above; otherwise the services
  mounted here report CPU, memory and the application's values, with no rates and no trailers.
- Without xds-protos: ``mount_waypost_report`` only (logged once, see ``_protos``).

``mount_waypost_report(server)`` mounts ``waypost.load.v1`` alone, the same way with a ``LoadInterceptor``.

The interceptor goes first because load reports must not depend on the application's interceptors (which could
reject a probe without its credentials) and the accounting should include their time. grpcio has no public way to
add an interceptor to a created server, so this sets the pipeline grpcio built from ``interceptors=``
(``_grpc_private``); when grpcio's internals differ, a warning is logged and the server reports CPU and the
application's values only.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal, overload

import grpc

from .._grpc_private import prepend_server_interceptor
from ._protos import protos
from .account import LoadAccount
from .load_interceptor import LoadInterceptor
from .recorder import ServerMetricsRecorder
from .reporter import OrcaReporter
from .server_interceptor import AsyncOrcaInterceptor, OrcaInterceptor
from .service import DEFAULT_MAX_STREAMS, DEFAULT_MIN_INTERVAL, OobService
from .waypost_report import Reporter

log = logging.getLogger("waypost.orca")


@dataclass
class Settings:
    """Process-wide ORCA settings, read when a server is mounted or an interceptor made (``configure``)."""

    per_call: bool = True
    min_interval: float = DEFAULT_MIN_INTERVAL
    max_streams: int = DEFAULT_MAX_STREAMS


settings = Settings()
_lock = threading.Lock()
#: server -> its recorder, for ``server_recorder(server)``; weak, so a stopped server is not kept alive
_recorders: weakref.WeakKeyDictionary[Any, ServerMetricsRecorder] = weakref.WeakKeyDictionary()


def configure(*, per_call: bool | None = None, min_interval: float | None = None,
              max_streams: int | None = None) -> None:
    """Set the ORCA defaults of servers mounted and interceptors made from now on.

    ``per_call``: add the ``endpoint-load-metrics-bin`` trailer to every call (default True);
    ``min_interval``: the floor of the out-of-band report interval, seconds (default 1; grpc-go's server uses
    30 s); ``max_streams``: out-of-band streams served at once per server (default 16).
    """
    if min_interval is not None:
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval!r}")
        settings.min_interval = float(min_interval)
    if max_streams is not None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams!r}")
        settings.max_streams = int(max_streams)
    if per_call is not None:
        settings.per_call = bool(per_call)


@overload
def interceptor(aio: Literal[False] = False, recorder: ServerMetricsRecorder | None = None) -> OrcaInterceptor: ...
@overload
def interceptor(aio: Literal[True], recorder: ServerMetricsRecorder | None = None) -> AsyncOrcaInterceptor: ...
@overload
def interceptor(aio: bool, recorder: ServerMetricsRecorder | None = None
                ) -> OrcaInterceptor | AsyncOrcaInterceptor: ...
def interceptor(aio: bool = False, recorder: ServerMetricsRecorder | None = None
                ) -> OrcaInterceptor | AsyncOrcaInterceptor:
    """A new ORCA interceptor (load accounting included) for ``grpc.server`` or, ``aio=True``, ``grpc.aio.server``.

    ``recorder``: the server's ``ServerMetricsRecorder`` (default: a new one, at ``.recorder``).
    """
    cls = AsyncOrcaInterceptor if aio else OrcaInterceptor
    return cls(recorder=recorder, per_call=settings.per_call, min_interval=settings.min_interval,
               max_streams=settings.max_streams)


def mount(server: grpc.Server | grpc.aio.Server, recorder: ServerMetricsRecorder | None = None) -> ServerMetricsRecorder | None:
    """Add waypost's load reports and ORCA to ``server`` (see the module doc); the server's recorder, or None
    without xds-protos (then only ``waypost.load.v1`` is mounted)."""
    if protos() is None:
        mount_waypost_report(server)
        return None
    aio = isinstance(server, grpc.aio.Server)
    installed = _install(server, lambda: interceptor(False, recorder), "ORCA", "waypost.orca.interceptor()",
                         "for rates and trailers")
    if isinstance(installed, OrcaInterceptor):
        reporter, oob = installed.orca, installed.oob
    else:
        account = _serve_waypost_report(server, installed, aio)
        reporter = OrcaReporter(account, recorder)
        oob = OobService(reporter, settings.min_interval, settings.max_streams)
    server.add_generic_rpc_handlers((oob.generic_handler(aio=aio),))
    with suppress(TypeError), _lock:  # a server object that takes no weak reference: found through its handle only
        _recorders[server] = reporter.recorder
    return reporter.recorder


def mount_waypost_report(server: grpc.Server | grpc.aio.Server) -> LoadAccount | None:
    """Add the ``waypost.load.v1`` service (and, on a ``grpc.server``, the load interceptor) to ``server``.

    Returns the account the reports are built from (None when the calls cannot be accounted here).
    """
    installed = _install(server, LoadInterceptor, "load reports", "waypost.load_interceptor()", "to report calls")
    return _serve_waypost_report(server, installed, isinstance(server, grpc.aio.Server))


def _install(server: grpc.Server | grpc.aio.Server, make: Callable[[], LoadInterceptor], what: str, hint: str,
             purpose: str) -> LoadInterceptor | None:
    """The load interceptor first in a ``grpc.server``'s pipeline: ``make()``'s, or the one already there; None on
    a ``grpc.aio.server`` (it takes interceptors only when created) or when grpcio's internals are not known."""
    if isinstance(server, grpc.aio.Server):
        return None
    installed = prepend_server_interceptor(server, make(), keep=LoadInterceptor)
    if installed is None:
        log.warning("%s: cannot add the load interceptor to %r (unknown grpcio internals); pass "
                    "interceptors=[%s] to grpc.server() %s", what, server, hint, purpose)
    return installed


def _serve_waypost_report(server: grpc.Server | grpc.aio.Server, installed: LoadInterceptor | None, aio: bool) -> LoadAccount | None:
    """Mount the ``waypost.load.v1`` service on ``server``, reporting from ``installed``'s account (if any)."""
    account = installed.account if installed is not None else None
    # answers only when no load interceptor is present: an interceptor answers the reports itself
    server.add_generic_rpc_handlers((Reporter(account).generic_handler(aio=aio),))
    return account


def server_recorder(server: object) -> ServerMetricsRecorder:
    """The ``ServerMetricsRecorder`` of a server: a ``waypost.serve``/``serve_async`` handle, a grpc server
    mounted by it, or an ORCA interceptor. Raises LookupError when there is none (not served by waypost, or
    xds-protos missing)."""
    rec = getattr(server, "orca_recorder", None)
    if rec is None and isinstance(server, (OrcaInterceptor, AsyncOrcaInterceptor)):
        rec = server.recorder
    if rec is None:
        try:
            with _lock:
                rec = _recorders.get(server)
        except TypeError:
            rec = None
    if rec is None:
        raise LookupError(f"waypost.orca.server_recorder: {server!r} reports no ORCA load (serve it with "
                          "waypost.serve, and install waypost[xds])")
    return rec  # type: ignore[no-any-return]
