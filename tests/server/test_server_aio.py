"""waypost.serve_async(): the same lifecycle for grpc.aio servers."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from waypost.etcd.local import free_port
from waypost.server import serve_async


class AioEcho(echo_pb2_grpc.EchoServicer):
    async def Unary(self, request, context):
        if request.delay_ms:
            await asyncio.sleep(request.delay_ms / 1000)
        return echo_pb2.EchoReply(message=request.message, server="aio")


def new_server() -> grpc.aio.Server:
    s = grpc.aio.server()
    echo_pb2_grpc.add_EchoServicer_to_server(AioEcho(), s)
    return s


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return r.status


async def registered(url: str, key: str) -> list[str]:
    res = await asyncio.wrap_future(waypost._loop.submit(waypost.connect(url).get(key + "/", prefix=True)))
    return [kv.value.decode() for kv in res.kvs]


@pytest.mark.parametrize("backend", ["memory", "etcd"])
async def test_aio_serve_lifecycle(backend, shared_etcd, unique_key):
    url = f"memory://aio-{unique_key}" if backend == "memory" else shared_etcd.url()
    h = await serve_async(new_server(), unique_key, listen_on="127.0.0.1:0", registry=url, grace=5)
    try:
        assert h.address == f"127.0.0.1:{h.port}"
        assert await registered(url, unique_key) == [h.address]
        assert await health(h.address) == health_pb2.HealthCheckResponse.SERVING
        await h.pause()
        assert await registered(url, unique_key) == []
        assert await health(h.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        await h.resume()
        assert await registered(url, unique_key) == [h.address]

        async with grpc.aio.insecure_channel(h.address) as ch:
            slow = asyncio.ensure_future(
                echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="slow", delay_ms=800), timeout=20))
            await asyncio.sleep(0.2)
            await h.stop()  # deregisters, then drains the in-flight call
            assert (await slow).message == "slow"
        assert await registered(url, unique_key) == []
        assert h.stopped
    finally:
        await h.stop()


async def test_aio_wait_returns_on_stop(unique_key):
    h = await serve_async(new_server(), unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}",
                          grace=0)
    waiter = asyncio.ensure_future(h.wait())
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await h.stop()
    await asyncio.wait_for(waiter, 10)
    assert h.stopped


async def test_aio_registry_down_raises(unique_key):
    with pytest.raises(waypost.RegistryUnavailable):
        await serve_async(new_server(), unique_key, listen_on="127.0.0.1:0",
                          registry=f"etcd://127.0.0.1:{free_port()}", register_timeout=2)
