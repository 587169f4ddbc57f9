"""The load interceptor's handler wrapping, driven in-process: every behaviour kind, failures, caching."""

from __future__ import annotations

import asyncio
from collections import namedtuple

import grpc
import pytest

from waypost.orca import REPORT_METHOD, AsyncLoadInterceptor, LoadInterceptor
from waypost.orca import waypost_load_pb as pb

Details = namedtuple("Details", ["method", "invocation_metadata"])
ECHO = Details("/waypost.test.Echo/Unary", ())


def intercept(interceptor: LoadInterceptor, handler, details=ECHO):
    return interceptor.intercept_service(lambda _d: handler, details)


def test_unary_calls_are_counted_and_a_raise_is_a_failure():
    it = LoadInterceptor()

    def behavior(request, context):
        if request == "boom":
            raise RuntimeError("boom")
        assert it.account.snapshot().in_flight == 1  # counted while it runs
        return request

    wrapped = intercept(it, grpc.unary_unary_rpc_method_handler(behavior))
    assert wrapped.unary_unary("x", None) == "x"
    with pytest.raises(RuntimeError):
        wrapped.unary_unary("boom", None)
    snap = it.account.snapshot()
    assert (snap.in_flight, snap.calls_completed, snap.calls_failed) == (0, 2, 1)


def test_a_response_stream_counts_until_exhausted_or_closed():
    it = LoadInterceptor()

    def behavior(request, context):
        yield from range(3)

    wrapped = intercept(it, grpc.unary_stream_rpc_method_handler(behavior))
    assert list(wrapped.unary_stream(None, None)) == [0, 1, 2]
    stream = wrapped.unary_stream(None, None)
    next(stream)
    assert it.account.snapshot().in_flight == 1
    stream.close()  # what grpcio does when the client cancels
    snap = it.account.snapshot()
    assert (snap.in_flight, snap.calls_completed, snap.calls_failed) == (0, 2, 1)


def test_wrapped_handlers_are_cached_and_infrastructure_calls_are_not_counted():
    it = LoadInterceptor()
    handler = grpc.unary_unary_rpc_method_handler(lambda r, c: r)
    assert intercept(it, handler) is intercept(it, handler)
    health = Details("/grpc.health.v1.Health/Watch", ())
    assert intercept(it, handler, health) is handler
    assert intercept(it, None) is None  # unknown method: grpcio answers UNIMPLEMENTED


def test_reports_are_answered_by_the_interceptor_itself():
    it = LoadInterceptor()

    def never(_details):
        raise AssertionError("the continuation must not be called for a load report")

    report = it.intercept_service(never, Details(REPORT_METHOD, ()))
    msg = report.unary_unary(pb.ReportRequest(), None)
    assert msg.in_flight == 0 and msg.calls_completed == 0


def test_aio_coroutines_and_async_generators_are_counted():
    it = AsyncLoadInterceptor()

    async def unary(request, context):
        await asyncio.sleep(0)
        return request

    async def stream(request, context):
        for i in range(2):
            yield i

    async def main():
        u = await it.intercept_service(_acont(grpc.unary_unary_rpc_method_handler(unary)), ECHO)
        assert await u.unary_unary("x", None) == "x"
        s = await it.intercept_service(_acont(grpc.unary_stream_rpc_method_handler(stream)),
                                       Details("/waypost.test.Echo/ServerStream", ()))
        assert [i async for i in s.unary_stream(None, None)] == [0, 1]
        r = await it.intercept_service(_acont(None), Details(REPORT_METHOD, ()))
        return await r.unary_unary(pb.ReportRequest(), None)

    msg = asyncio.run(main())
    assert (msg.in_flight, msg.calls_completed, msg.calls_failed) == (0, 2, 0)


def _acont(handler):
    async def continuation(_details):
        return handler

    return continuation
