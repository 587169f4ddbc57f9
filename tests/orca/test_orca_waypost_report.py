"""Load reports on real gRPC servers: serve() and serve_async() mount them; plain servers still work."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer, EchoServicer
from harness.waiting import wait_until
from waypost.balancer.policies import POLICIES
from waypost.orca import LoadInterceptor, load_interceptor, report_stub, set_load
from waypost.orca import waypost_load_pb as pb
from waypost.server import serve, serve_async


def report(address: str) -> pb.LoadReport:
    with grpc.insecure_channel(address) as ch:
        return report_stub(ch)(pb.ReportRequest(), timeout=10)


@pytest.fixture(autouse=True)
def _no_app_value():
    set_load(None)
    yield
    set_load(None)


class Tagging(grpc.ServerInterceptor):
    """An application interceptor: must still run when serve() adds the load interceptor."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def intercept_service(self, continuation, details):
        self.seen.append(details.method)
        return continuation(details)


class Gated(EchoServicer):
    """Unary calls with message "hold" wait for ``gate`` (bounded): calls in flight on demand."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.gate = threading.Event()

    def Unary(self, request, context):
        if request.message == "hold":
            self.gate.wait(30)
        return super().Unary(request, context)


def test_serve_reports_in_flight_latency_and_app_value(unique_key):
    app = Tagging()
    servicer = Gated()
    server = grpc.server(futures.ThreadPoolExecutor(16), interceptors=[app])
    echo_pb2_grpc.add_EchoServicer_to_server(servicer, server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        first = report(h.address)
        assert first.HasField("in_flight") and first.in_flight == 0
        assert not first.HasField("latency_estimate_seconds")  # nothing ended yet
        assert not first.HasField("application_utilization")

        with grpc.insecure_channel(h.address) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            slow = [stub.Unary.future(echo_pb2.EchoRequest(message="hold"), timeout=30) for _ in range(3)]
            wait_until(lambda: report(h.address).in_flight == 3, what="3 calls in flight")
            servicer.gate.set()
            for f in slow:
                f.result()
            stub.Unary(echo_pb2.EchoRequest(message="y"), timeout=10)
        set_load(7.5)
        r = report(h.address)
        assert r.in_flight == 0
        assert r.calls_completed == 4  # health checks and reports are not counted
        assert r.latency_estimate_seconds > 0
        assert r.application_utilization == 7.5
        assert "/waypost.test.Echo/Unary" in app.seen  # the application's interceptor still runs
        assert not any(m.startswith("/waypost.load.v1.") for m in app.seen)  # reports bypass it


def test_serve_keeps_a_load_interceptor_given_by_the_app(unique_key):
    ours = load_interceptor()
    assert isinstance(ours, LoadInterceptor)
    server = grpc.server(futures.ThreadPoolExecutor(8), interceptors=[ours])
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("s1"), server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        with grpc.insecure_channel(h.address) as ch:
            echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="x"), timeout=10)
        assert ours.account.snapshot().calls_completed == 1
        assert report(h.address).calls_completed == 1


def test_streams_count_until_they_end_and_failures_are_counted(unique_key):
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("s1"), server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        with grpc.insecure_channel(h.address) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            requests: queue.Queue[echo_pb2.EchoRequest | None] = queue.Queue()

            def outgoing():
                for _ in range(100):  # bounded; ends at the None below
                    item = requests.get(timeout=30)
                    if item is None:
                        return
                    yield item

            stream = stub.BidiStream(outgoing(), timeout=30)
            requests.put(echo_pb2.EchoRequest(message="s"))
            next(stream)
            assert report(h.address).in_flight == 1  # open until the client ends its requests
            requests.put(None)
            assert list(stream) == []
            with pytest.raises(grpc.RpcError):
                stub.Unary(echo_pb2.EchoRequest(message="f", error_code=grpc.StatusCode.INTERNAL.value[0]),
                           timeout=10)
        r = report(h.address)
        assert (r.in_flight, r.calls_completed, r.calls_failed) == (0, 2, 1)


class AioEcho(echo_pb2_grpc.EchoServicer):
    """Unary calls with message "hold" wait for ``gate`` (bounded)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def Unary(self, request, context):
        if request.message == "hold":
            await asyncio.wait_for(self.gate.wait(), 30)
        await asyncio.sleep(request.delay_ms / 1000)
        return echo_pb2.EchoReply(message=request.message, server="aio")


async def aio_report(address: str) -> pb.LoadReport:
    async with grpc.aio.insecure_channel(address) as ch:
        return await report_stub(ch)(pb.ReportRequest(), timeout=10)


async def test_serve_async_with_the_load_interceptor_reports_calls(unique_key):
    server = grpc.aio.server(interceptors=[load_interceptor(aio=True)])
    servicer = AioEcho()
    echo_pb2_grpc.add_EchoServicer_to_server(servicer, server)
    h = await serve_async(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0)
    try:
        async with grpc.aio.insecure_channel(h.address) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            calls = [asyncio.ensure_future(stub.Unary(echo_pb2.EchoRequest(message="hold", delay_ms=200),
                                                      timeout=30)) for _ in range(2)]
            for _ in range(200):  # bounded: up to ~10 s
                if (await aio_report(h.address)).in_flight == 2:
                    break
                await asyncio.sleep(0.05)
            assert (await aio_report(h.address)).in_flight == 2
            servicer.gate.set()
            await asyncio.gather(*calls)
        r = await aio_report(h.address)
        assert (r.in_flight, r.calls_completed) == (0, 2)
        assert r.latency_estimate_seconds >= 0.2
    finally:
        await h.stop()


async def test_serve_async_without_the_interceptor_reports_what_it_can(unique_key):
    server = grpc.aio.server()
    echo_pb2_grpc.add_EchoServicer_to_server(AioEcho(), server)
    set_load(lambda: 0.25)
    h = await serve_async(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0)
    try:
        r = await aio_report(h.address)
        assert not r.HasField("in_flight")
        assert r.application_utilization == 0.25
    finally:
        await h.stop()


# every registered policy that needs no per-call input (consistent_hash wants a hash key) and no child
# config (outlier_detection wraps another policy)
SIMPLE_POLICIES = sorted(set(POLICIES) - {"consistent_hash", "outlier_detection"})


@pytest.mark.parametrize("policy", SIMPLE_POLICIES)
def test_every_policy_works_with_and_without_load_reports(policy, unique_key):
    plain = EchoServer("plain").start()  # a plain grpc server: no load-report service
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("served"), server)
    try:
        with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
            with grpc.insecure_channel(plain.address) as ch, pytest.raises(grpc.RpcError) as e:
                report_stub(ch)(pb.ReportRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # a service config, not balancer=: weighted_round_robin there is gRPC's policy (ORCA weights)
            ch2 = waypost.dial(f"direct:///{plain.address},{h.address}",
                               service_config={"loadBalancingConfig": [{policy: {}}]})
            try:
                stub = echo_pb2_grpc.EchoStub(ch2)
                seen = {stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=10).server for _ in range(40)}
            finally:
                ch2.close()
            assert seen <= {"plain", "served"} and seen
    finally:
        plain.stop(0)


def test_health_still_answers_beside_load_reports(unique_key):
    server = grpc.server(futures.ThreadPoolExecutor(4))
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        with grpc.insecure_channel(h.address) as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert report(h.address).calls_completed == 0
