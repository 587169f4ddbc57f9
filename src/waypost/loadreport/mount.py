"""``mount(server)``: make a server (not started yet) answer load reports; ``serve()`` calls it.

On a ``grpc.server`` a ``LoadInterceptor`` is put first in the server's interceptor pipeline (grpcio
has no public way to add an interceptor to a created server, so this sets the pipeline grpcio built
from ``interceptors=``; when grpcio's internals differ, a warning is logged and the server reports
CPU and the application value only). One already there (``interceptors=[waypost.load_interceptor()]``)
is kept. First, because load reports must not depend on the application's interceptors (which could
reject a probe without its credentials) and the accounting should include their time.

A ``grpc.aio.server`` cannot get interceptors once created: it reports calls in flight and latency
when it was created with ``interceptors=[waypost.load_interceptor(aio=True)]`` (that interceptor
answers the reports); otherwise the service mounted here answers with CPU and the application value.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from .._grpc_private import prepend_server_interceptor
from .account import LoadAccount
from .interceptor import LoadInterceptor
from .service import Reporter

log = logging.getLogger("waypost.loadreport")


def mount(server: Any) -> LoadAccount | None:
    """Add the load-report service (and, on a ``grpc.server``, the load interceptor) to ``server``.

    Returns the account the reports are built from (None when the calls cannot be accounted here).
    """
    aio = isinstance(server, grpc.aio.Server)
    interceptor = None if aio else _install(server)
    account = interceptor.account if interceptor is not None else None
    # answers only when no load interceptor is present: an interceptor answers the reports itself
    server.add_generic_rpc_handlers((Reporter(account).generic_handler(aio=aio),))
    return account


def _install(server: Any) -> LoadInterceptor | None:
    installed = prepend_server_interceptor(server, LoadInterceptor(), keep=LoadInterceptor)
    if installed is None:
        log.warning("load reports: cannot add the load interceptor to %r (unknown grpcio internals); "
                    "pass interceptors=[waypost.load_interceptor()] to grpc.server() to report calls", server)
    return installed
