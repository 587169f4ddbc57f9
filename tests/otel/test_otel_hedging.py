"""Traces of hedged calls and of retried response streams (waypost.otel, the SDK's in-memory exporter, real
servers): each hedge is an attempt span of the call, named ``hedge`` with why it was sent; the loser ends
CANCELLED; a sync response stream's retry, started while the caller iterates, is still the call's child."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import waypost
import waypost.aio
import waypost.otel
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.channel.hedging_support import hedging_config, scripted_servers
from tests.channel.support import direct

ECHO = "waypost.test.Echo"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    waypost.otel.enable(tracer_provider=provider, metrics_on=False)
    try:
        yield exporter
    finally:
        waypost.otel.disable()


def attempts_of(exporter: InMemorySpanExporter, method: str) -> list[list]:
    """Per call span of ``method`` (in start order): its attempt spans, in start order."""
    finished = exporter.get_finished_spans()
    calls = sorted((s for s in finished if s.name == f"Sent.{ECHO}.{method}"), key=lambda s: s.start_time)
    return [sorted((s for s in finished if s.parent is not None and s.parent.span_id == c.context.span_id),
                   key=lambda s: s.start_time) for c in calls]


def check_hedged(exporter: InMemorySpanExporter, addresses: list[str], method: str) -> None:
    [attempts] = attempts_of(exporter, method)
    assert [a.attributes["waypost.attempt.kind"] for a in attempts] == ["first", "hedge"]
    assert attempts[1].attributes["waypost.attempt.reason"] == "hedging delay"
    assert attempts[0].attributes["waypost.backend"] != attempts[1].attributes["waypost.backend"]
    assert {a.attributes["waypost.backend"] for a in attempts} <= set(addresses)
    # the first attempt blocked and lost the race: cancelled when the hedge committed
    assert [a.attributes["rpc.grpc.status_code"] for a in attempts] == [grpc.StatusCode.CANCELLED.value[0], 0]


def test_a_sync_hedge_is_an_attempt_span_of_the_call(spans):
    with scripted_servers("a", "b") as (addresses, log), \
            waypost.dial("direct:///" + ",".join(addresses), service_config=hedging_config()) as ch:
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
        reply = echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="block,ok"), timeout=20)
        assert reply.previous_attempts == "1"
        wait_until(lambda: log.of("cancelled"), 20)  # the loser's end reached its server
    check_hedged(spans, addresses, "Unary")


def test_an_aio_hedge_is_an_attempt_span_of_the_call(spans):
    with scripted_servers("a", "b") as (addresses, _log):
        async def run() -> str:
            async with waypost.aio.dial("direct:///" + ",".join(addresses), service_config=hedging_config()) as ch:
                for _ in range(600):
                    if len(ch.balancer.ready_addresses()) == 2:
                        break
                    await asyncio.sleep(0.05)
                reply = await echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="block,ok"), timeout=20)
                return reply.previous_attempts

        assert asyncio.run(asyncio.wait_for(run(), 60)) == "1"
    check_hedged(spans, addresses, "Unary")


def test_a_sync_stream_retried_while_iterating_keeps_its_attempts_under_the_call(spans):
    servers = [EchoServer("a").start(), EchoServer("b").start()]
    retry = {"methodConfig": [{"name": [{"service": ECHO}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    try:
        with waypost.dial(direct(servers), balancer="round_robin", service_config=retry) as ch:
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
            stub = echo_pb2_grpc.EchoStub(ch)
            req = echo_pb2.EchoRequest(count=2, fail_on="a", error_code=grpc.StatusCode.UNAVAILABLE.value[0])
            for _ in range(4):
                assert [r.server for r in stub.ServerStream(req, timeout=20)] == ["b", "b"]
    finally:
        for s in servers:
            s.stop(0)
    calls = attempts_of(spans, "ServerStream")
    assert len(calls) == 4
    retried = [c for c in calls if len(c) == 2]
    assert retried, "no stream started on a"
    for attempts in retried:
        assert [a.attributes["waypost.backend"] for a in attempts] == [s.address for s in servers]
        assert [a.attributes["waypost.attempt.kind"] for a in attempts] == ["first", "retry"]


class AsyncEcho(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    async def Unary(self, request, context):
        return echo_pb2.EchoReply(server=self.name)

    async def ServerStream(self, request, context):
        for i in range(2):
            yield echo_pb2.EchoReply(server=self.name, index=i)


def test_a_grpc_aio_server_with_the_interceptor_joins_the_clients_trace(spans):
    async def run() -> list[str]:
        server = grpc.aio.server(interceptors=[waypost.otel.server_interceptor(aio=True)])
        echo_pb2_grpc.add_EchoServicer_to_server(AsyncEcho("aio"), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with waypost.aio.dial(f"direct:///127.0.0.1:{port}") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                got = [(await stub.Unary(echo_pb2.EchoRequest(), timeout=20)).server]
                got += [r.server async for r in stub.ServerStream(echo_pb2.EchoRequest(), timeout=20)]
                return got
        finally:
            await server.stop(0)

    assert asyncio.run(asyncio.wait_for(run(), 60)) == ["aio", "aio", "aio"]
    finished = spans.get_finished_spans()
    for method in ("Unary", "ServerStream"):
        [attempt] = [s for s in finished if s.name == f"Attempt.{ECHO}.{method}"]
        [recv] = [s for s in finished if s.name == f"Recv.{ECHO}.{method}"]
        assert recv.parent is not None and recv.parent.span_id == attempt.context.span_id
        assert recv.context.trace_id == attempt.context.trace_id
