"""The grpc.aio multicallables behind ``waypost.aio.dial``: one per method and call kind, holding what
every call of that method shares (its method config, the per-backend grpc.aio multicallables, the
outcome report), and making the call objects of ``aio_unary_calls`` and ``aio_stream_calls``."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from .aio_call_base import AioMethod
from .aio_replay import AsyncReplay, WriteReplay
from .aio_stream_calls import StreamStreamCall, UnaryStreamCall
from .aio_unary_calls import StreamUnaryCall, UnaryUnaryCall
from .replay import Replay


def _requests(request_iterator: Any) -> dict[str, Any]:
    """How a client-streaming call's requests are kept for replay into a retry (sync or async iterator, or
    the write API when there is no iterator)."""
    if request_iterator is None:
        return {"writes": WriteReplay()}
    if hasattr(request_iterator, "__aiter__"):
        return {"replay": AsyncReplay(request_iterator)}
    return {"replay": Replay(request_iterator)}


class UnaryUnaryMultiCallable(AioMethod, grpc.aio.UnaryUnaryMultiCallable):
    _kind = "unary_unary"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryUnaryCall:
        return UnaryUnaryCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(AioMethod, grpc.aio.UnaryStreamMultiCallable):
    _kind = "unary_stream"

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> UnaryStreamCall:
        return UnaryStreamCall(self, request, timeout, metadata, credentials, wait_for_ready, compression)


class StreamUnaryMultiCallable(AioMethod, grpc.aio.StreamUnaryMultiCallable):
    _kind = "stream_unary"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamUnaryCall:
        return StreamUnaryCall(self, None, timeout, metadata, credentials, wait_for_ready, compression,
                               **_requests(request_iterator))


class StreamStreamMultiCallable(AioMethod, grpc.aio.StreamStreamMultiCallable):
    _kind = "stream_stream"

    def __call__(self, request_iterator: Any = None, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None
                 ) -> StreamStreamCall:
        return StreamStreamCall(self, None, timeout, metadata, credentials, wait_for_ready, compression,
                                **_requests(request_iterator))
