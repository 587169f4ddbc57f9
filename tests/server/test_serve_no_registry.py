"""serve(..., registry=None): inside Kubernetes nothing is registered; the health service is the readiness signal.

Real servers, a real grpc.health.v1 Watch stream as a readiness probe sees it: NOT_SERVING before start, SERVING
after, NOT_SERVING as soon as the graceful stop begins and while calls are still served (the drain delay),
NOT_SERVING while paused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthWatch:
    """A grpc.health.v1 Watch on its own thread, recording (status, server still answers Echo)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.seen: list[tuple[int, bool]] = []
        self._ch = grpc.insecure_channel(address)
        self._call = health_pb2_grpc.HealthStub(self._ch).Watch(health_pb2.HealthCheckRequest(service=""),
                                                                 timeout=30)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for resp in self._call:
                self.seen.append((resp.status, self._echo_answers()))
        except grpc.RpcError:
            pass

    def _echo_answers(self) -> bool:
        try:
            with grpc.insecure_channel(self.address) as ch:
                echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=2)
            return True
        except grpc.RpcError:
            return False

    def close(self) -> None:
        self._call.cancel()
        self._ch.close()
        self._thread.join(5)


def test_registry_none_registers_nothing_and_health_drives_readiness():
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("k"), server)
    # grace 1 s: the open Watch stream is a call in flight, which the stop waits for up to grace
    handle = waypost.serve(server, "greet.rpc", "127.0.0.1:0", registry=None, drain_delay=0.5, grace=1)
    watch = HealthWatch(handle.address)
    try:
        assert handle.registered_key is None and handle.registry is None
        wait_until(lambda: watch.seen and watch.seen[-1][0] == SERVING, 10, what="SERVING after start")
        handle.pause()
        wait_until(lambda: watch.seen[-1][0] == NOT_SERVING, 10, what="NOT_SERVING while paused")
        handle.resume()
        wait_until(lambda: watch.seen[-1][0] == SERVING, 10, what="SERVING after resume")
        t0 = time.monotonic()
        handle.stop()
        # the probe saw NOT_SERVING while the server still answered calls: the pod leaves the slices first
        assert (NOT_SERVING, True) in watch.seen[-2:], watch.seen
        assert time.monotonic() - t0 >= 0.5  # the drain delay was kept
    finally:
        watch.close()
        handle.stop()


def test_registry_none_refuses_outage_options():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    with pytest.raises(ValueError, match="need a registry"):
        waypost.serve(server, "greet.rpc", "127.0.0.1:0", registry=None, max_unregistered=5)


def test_registry_none_with_the_aio_server():
    async def main() -> None:
        server = grpc.aio.server()
        echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("k"), server)
        handle = await waypost.serve_async(server, "greet.rpc", "127.0.0.1:0", registry=None, drain_delay=0.3,
                                           grace=1)
        try:
            assert handle.registered_key is None
            async with grpc.aio.insecure_channel(handle.address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == SERVING
                watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=20)
                assert (await watch.read()).status == SERVING
                stopping = asyncio.ensure_future(handle.stop())
                assert (await watch.read()).status == NOT_SERVING
                # still answering during the drain delay
                await echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=2)
                await stopping
        finally:
            await handle.stop()

    asyncio.run(main())
