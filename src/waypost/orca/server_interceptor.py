"""The ORCA interceptor: waypost's load interceptor (``load_interceptor``: calls in flight, latency,
``waypost.load.v1`` reports) plus ORCA: the ``endpoint-load-metrics-bin`` trailer on each call (``per_call``) and
the out-of-band ``StreamCoreMetrics`` service, answered by the interceptor itself.

``OrcaInterceptor`` is for ``grpc.server``, ``AsyncOrcaInterceptor`` for ``grpc.aio.server``; ``interceptor()``
makes either. Each handler is wrapped once by the load interceptor's ``HandlerWrapper`` and each call runs in a
``ReportedCall``: a call pays the load accounting, a context variable set and reset (where ``call_recorder`` finds the call) and,
with ``per_call``, one cached report added to the call's trailing metadata, after any the handler set, under two
keys: ``endpoint-load-metrics-bin`` (gRPC's: grpc-go, grpc-java and C-core policies read it) and
``waypost-load-metrics-bin`` (the same bytes), and ``call_load``'s ``waypost-server-load`` (the server's requests
in flight and latency estimate as the call ends: what ``prequal`` balances on, without a probe). grpcio's C-core consumes gRPC's key on the client and never hands
it to Python code, so waypost's own Python client reads the second one.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING, Any

from .account import LoadAccount
from .handler_wrapper import CountedCall, add_trailers
from .load_interceptor import AsyncLoadInterceptor, LoadInterceptor, LoadInterceptorBase
from .recorder import CallSlot, ServerMetricsRecorder, current_slot
from .reporter import OrcaReporter
from .service import DEFAULT_MAX_STREAMS, DEFAULT_MIN_INTERVAL, OOB_METHOD, OobService

if TYPE_CHECKING:
    import grpc
    import grpc.aio

log = logging.getLogger("waypost.orca")


class ReportedCall(CountedCall):
    """A counted call that ``call_recorder`` finds (a context variable, while its handler runs) and that, with a
    ``reporter``, ends by adding its ORCA report to the call's trailing metadata (not when the handler raised: its
    error status is all the call answers)."""

    __slots__ = ("_reporter", "_reset", "slot")

    def __init__(self, account: LoadAccount, reporter: OrcaReporter | None,
                 context: grpc.ServicerContext | grpc.aio.ServicerContext) -> None:
        CountedCall.__init__(self, account, context)
        self._reporter = reporter
        self.slot = CallSlot()
        self._reset = current_slot.set(self.slot)

    def raised(self) -> None:
        current_slot.reset(self._reset)
        CountedCall.raised(self)

    def end(self, failed: bool) -> None:
        with suppress(ValueError):  # a response stream closed from another context (grpcio cancelling it)
            current_slot.reset(self._reset)
        self._account.end(self._token, failed)
        # after the call left the account: the load its client's next call meets
        md = self.load_trailer()
        if self._reporter is not None:
            md = _orca_trailer(self._reporter, self.slot) + md
        add_trailers(self._context, md)

    def detach(self) -> None:
        current_slot.reset(self._reset)

    def attach(self) -> None:
        self._reset = current_slot.set(self.slot)


def _orca_trailer(reporter: OrcaReporter, slot: CallSlot) -> tuple[tuple[str, Any], ...]:
    try:
        return reporter.trailer_metadata(slot.recorder)
    except Exception:  # a report must never fail the call it rides on
        log.debug("ORCA: no trailer for this call", exc_info=True)
        return ()


class OrcaInterceptorBase(LoadInterceptorBase):
    """What both ORCA interceptors add to the load interceptor: the ORCA reporter, its recorder, the out-of-band
    service they answer, and calls that carry the per-call trailer (``per_call``)."""

    def __init__(self, account: LoadAccount | None = None, recorder: ServerMetricsRecorder | None = None, *,
                 per_call: bool = True, min_interval: float = DEFAULT_MIN_INTERVAL,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        account = account if account is not None else LoadAccount()
        self.orca = OrcaReporter(account, recorder)
        self.recorder: ServerMetricsRecorder = self.orca.recorder
        self.oob = OobService(self.orca, min_interval, max_streams)
        super().__init__(account, start_call=partial(ReportedCall, account, self.orca if per_call else None),
                         answers={OOB_METHOD: self.oob.method_handler(aio=self.aio)})


class OrcaInterceptor(OrcaInterceptorBase, LoadInterceptor):
    """Load accounting, ``waypost.load.v1`` reports and ORCA for a ``grpc.server`` (see the module doc)."""


class AsyncOrcaInterceptor(OrcaInterceptorBase, AsyncLoadInterceptor):
    """``OrcaInterceptor`` for a ``grpc.aio.server`` (pass it in ``interceptors=`` when creating the server)."""
