"""``dial(..., block=)``: eager or lazy discovery, sync and aio, against a refused etcd port and a real etcd
started late (real gRPC servers, no mocks)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from waypost.etcd.local import free_port

Req = echo_pb2.EchoRequest


@pytest.fixture
def refused() -> str:
    """An etcd target whose port nobody listens on, and its host:port."""
    return f"127.0.0.1:{free_port()}"


def _names_registry(details: str, endpoint: str) -> bool:
    return f"etcd at {endpoint} unreachable" in details and "refused" in details.lower()


def test_sync_block_true_raises_within_its_timeout_naming_the_registry(refused):
    t0 = time.monotonic()
    with pytest.raises(waypost.RegistryUnavailable) as ei:
        waypost.dial(f"etcd:///{refused}?key=greet.rpc")  # block=True is the default
    assert time.monotonic() - t0 < 15  # its timeout is 5 s
    assert _names_registry(str(ei.value), refused), str(ei.value)


def test_sync_block_false_returns_at_once_and_calls_fail_naming_the_registry(refused):
    t0 = time.monotonic()
    with waypost.dial(f"etcd:///{refused}?key=greet.rpc", block=False) as ch:
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(grpc.RpcError) as ei:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=1)
        assert ei.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert _names_registry(ei.value.details(), refused), ei.value.details()


def test_aio_block_false_returns_at_once_and_calls_fail_naming_the_registry(refused):
    async def main() -> None:
        t0 = time.monotonic()
        ch = waypost.aio.dial(f"etcd:///{refused}?key=greet.rpc")  # block=False is the aio default
        assert time.monotonic() - t0 < 1.0
        try:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=1)
            assert ei.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert _names_registry(ei.value.details(), refused), ei.value.details()
        finally:
            await ch.close()

    asyncio.run(main())


def test_aio_block_true_first_call_waits_for_the_load_then_fails_naming_the_registry(refused):
    async def main() -> None:
        t0 = time.monotonic()
        ch = waypost.aio.dial(f"etcd:///{refused}?key=greet.rpc", block=True)
        assert time.monotonic() - t0 < 1.0  # never blocks the event loop
        try:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
            took = time.monotonic() - t0
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert _names_registry(ei.value.details(), refused), ei.value.details()
            assert 3 < took < 15, took  # it waited for the first load (5 s), not for the 20 s deadline
        finally:
            await ch.close()

    asyncio.run(main())


@pytest.mark.parametrize("flavor", ["sync", "aio"])
def test_block_false_then_etcd_starts_calls_succeed_once_backends_register(flavor, etcd, unique_key):
    etcd.stop()  # the port is known, nothing listens on it yet
    target = f"etcd:///{etcd.endpoint}?key={unique_key}"
    with echo_servers("late") as (srv,):
        def register() -> waypost.Publisher:
            etcd.start()
            return waypost.Publisher(waypost.connect(etcd.url()), unique_key, srv.address).start()

        if flavor == "sync":
            with waypost.dial(target, block=False) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                with pytest.raises(grpc.RpcError):
                    stub.Unary(Req(), timeout=1)
                pub = register()
                try:
                    def ok() -> bool:
                        try:
                            return stub.Unary(Req(), timeout=2).server == "late"
                        except grpc.RpcError:
                            return False
                    wait_until(ok, 30, what="a call served once etcd is up and the backend registered")
                finally:
                    pub.stop()
            return

        async def main() -> None:
            ch = waypost.aio.dial(target, block=False)
            stub = echo_pb2_grpc.EchoStub(ch)
            try:
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Unary(Req(), timeout=1)
                pub = await asyncio.to_thread(register)
                try:
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            assert (await stub.Unary(Req(), timeout=2)).server == "late"
                            break
                        except grpc.aio.AioRpcError:
                            assert time.monotonic() < deadline, "no call served within 30 s of etcd starting"
                            await asyncio.sleep(0.1)
                finally:
                    await pub.astop()
            finally:
                await ch.close()

        asyncio.run(main())


def test_block_must_be_a_bool(refused):
    with pytest.raises(TypeError, match="block must be True or False"):
        waypost.dial(f"etcd:///{refused}?key=greet.rpc", block="no")
    with pytest.raises(TypeError, match="block must be True or False"):
        waypost.aio.dial(f"etcd:///{refused}?key=greet.rpc", block=1)
