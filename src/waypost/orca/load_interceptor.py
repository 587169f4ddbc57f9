"""The load interceptor: counts every call a server handles and answers its ``waypost.load.v1`` reports.

``LoadInterceptor`` (``grpc.server``) and ``AsyncLoadInterceptor`` (``grpc.aio.server``) each own a
``LoadAccount``. They wrap every method's handler (``handler_wrapper``) so that the account sees each call start
and end (streams: until the response iterator is exhausted or closed), and they answer
``waypost.load.v1.LoadReporter/Report`` themselves from that account, before any interceptor placed after them
(load reports carry no application data). The ORCA interceptors (``server_interceptor``) are these with more
answered methods and a call that also carries the ORCA trailer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, ClassVar

import grpc

from .account import LoadAccount
from .handler_wrapper import CountedCall, HandlerWrapper, StartCall
from .waypost_report import REPORT_METHOD, Reporter


class LoadInterceptorBase:
    """What the sync and aio load interceptors share: the account, the reporter, the answered methods, the wrapper.

    ``start_call`` and ``answers`` are for the ORCA interceptors: how a call is accounted (default: counted in
    ``account``) and the methods answered besides the load report.
    """

    aio: ClassVar[bool] = False

    def __init__(self, account: LoadAccount | None = None, *, start_call: StartCall | None = None,
                 answers: Mapping[str, grpc.RpcMethodHandler] | None = None) -> None:
        self.account = account if account is not None else LoadAccount()
        self.reporter = Reporter(self.account)
        self._answers = {REPORT_METHOD: self.reporter.method_handler(aio=self.aio), **(answers or {})}
        self._wrap = HandlerWrapper(start_call if start_call is not None else partial(CountedCall, self.account))


class LoadInterceptor(LoadInterceptorBase, grpc.ServerInterceptor):
    """Accounts a ``grpc.server``'s calls and answers its load reports (see the module doc)."""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        answer = self._answers.get(method)
        if answer is not None:
            return answer
        return self._wrap(continuation(handler_call_details), method)


class AsyncLoadInterceptor(LoadInterceptorBase, grpc.aio.ServerInterceptor):
    """``LoadInterceptor`` for a ``grpc.aio.server`` (pass it in ``interceptors=`` when creating it)."""

    aio = True

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        answer = self._answers.get(method)
        if answer is not None:
            return answer
        return self._wrap(await continuation(handler_call_details), method)


def load_interceptor(aio: bool = False) -> LoadInterceptor | AsyncLoadInterceptor:
    """A new load interceptor for a ``grpc.server`` (or, with ``aio=True``, a ``grpc.aio.server``).

    ``waypost.serve`` adds one to a ``grpc.server`` by itself; a ``grpc.aio.server`` cannot get
    interceptors after it is created, so create it with
    ``grpc.aio.server(interceptors=[waypost.load_interceptor(aio=True)])`` to report its calls.
    """
    return AsyncLoadInterceptor() if aio else LoadInterceptor()
