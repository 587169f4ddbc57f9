"""Retries on a fresh channel: when every READY backend was tried and another is still connecting, the next
attempt waits for it (within the deadline) instead of going back to a backend that already failed.

Real servers: ``x`` and ``y`` answer UNAVAILABLE to every call, ``g`` is healthy; ``g`` sits behind a loopback
proxy that delays every byte, so it becomes READY after the others. Every call is the first on a fresh channel.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.latency_proxy import LatencyProxy
from tests.channel.support import echo_servers

Req = echo_pb2.EchoRequest
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
FAIL = {"fail_on": "x,y", "error_code": UNAVAILABLE}
RETRY = {
    "methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}
ROUNDS = 10
CONCURRENT = 300
CALL_TIMEOUT = 20.0  # bounds every call; a pass never comes near it
# For the 1 s round trip of ``slower_g``: the default 1 s keepalive ping timeout would cut that link under load.
LONG_LINK = [("grpc.keepalive_timeout_ms", 10000), ("grpc.http2.ping_timeout_ms", 10000)]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str, str]]:
    """(x, y, g): the two failing backends' addresses and the healthy one's, direct."""
    with echo_servers("x", "y", "g", max_workers=64) as (x, y, g):
        yield x.address, y.address, g.address


@pytest.fixture(scope="module")
def slow_g(servers: tuple[str, str, str]) -> Iterator[str]:
    """The healthy backend seen through a link that adds 50 ms each way."""
    host, port = servers[2].rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), 0.05)
    try:
        yield proxy.endpoint
    finally:
        proxy.close()


def _target(x: str, y: str, g: str) -> str:
    return f"direct:///{x},{y},{g}"


def _sync_first_call(target: str, kind: str) -> str:
    with waypost.dial(target, service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        if kind == "unary":
            return str(stub.Unary(Req(**FAIL), timeout=CALL_TIMEOUT).server)
        replies = list(stub.ServerStream(Req(count=1, **FAIL), timeout=CALL_TIMEOUT))
        return str(replies[0].server)


async def _aio_first_call(target: str, kind: str) -> str:
    async with waypost.aio.dial(target, service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        if kind == "unary":
            return str((await stub.Unary(Req(**FAIL), timeout=CALL_TIMEOUT)).server)
        replies = [r async for r in stub.ServerStream(Req(count=1, **FAIL), timeout=CALL_TIMEOUT)]
        return str(replies[0].server)


@pytest.mark.parametrize("kind", ["unary", "stream"])
def test_sync_retry_waits_for_the_connecting_healthy_backend(servers, slow_g, kind):
    x, y, _ = servers
    answered = [_sync_first_call(_target(x, y, slow_g), kind) for _ in range(ROUNDS)]
    assert answered == ["g"] * ROUNDS


@pytest.mark.parametrize("kind", ["unary", "stream"])
async def test_aio_retry_waits_for_the_connecting_healthy_backend(servers, slow_g, kind):
    x, y, _ = servers
    answered = [await _aio_first_call(_target(x, y, slow_g), kind) for _ in range(ROUNDS)]
    assert answered == ["g"] * ROUNDS


def _sync_concurrent_first_calls(target: str, options: list[tuple[str, int]] | None = None) -> list[str]:
    """CONCURRENT threads make their first call on one fresh channel at once: who answered, or the error."""
    results: list[str] = []
    lock = threading.Lock()
    with waypost.dial(target, service_config=RETRY, options=options) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        start = threading.Barrier(CONCURRENT)

        def call() -> None:
            start.wait(CALL_TIMEOUT)
            try:
                out = str(stub.Unary(Req(**FAIL), timeout=CALL_TIMEOUT).server)
            except grpc.RpcError as e:
                out = f"{e.code().name}: {e.details()}"
            with lock:
                results.append(out)

        threads = [threading.Thread(target=call) for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * CALL_TIMEOUT)
    return results


def test_sync_concurrent_first_calls_all_reach_the_healthy_backend(servers):
    results = _sync_concurrent_first_calls(_target(*servers))
    assert results == ["g"] * CONCURRENT


async def test_aio_concurrent_first_calls_all_reach_the_healthy_backend(servers):
    x, y, g = servers
    async with waypost.aio.dial(_target(x, y, g), service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        results = await asyncio.gather(*(stub.Unary(Req(**FAIL), timeout=CALL_TIMEOUT) for _ in range(CONCURRENT)),
                                       return_exceptions=True)
    failed = [r for r in results if not isinstance(r, echo_pb2.EchoReply) or r.server != "g"]
    assert failed == []


@pytest.fixture
def slower_g(servers: tuple[str, str, str]) -> Iterator[str]:
    """The healthy backend 0.5 s away: still connecting after all 300 calls made their first two attempts."""
    host, port = servers[2].rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), 0.5)
    try:
        yield proxy.endpoint
    finally:
        proxy.close()


async def test_aio_concurrent_first_calls_wait_for_the_slow_healthy_backend(servers, slower_g):
    x, y, _ = servers
    async with waypost.aio.dial(_target(x, y, slower_g), service_config=RETRY, options=LONG_LINK) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        results = await asyncio.gather(*(stub.Unary(Req(**FAIL), timeout=CALL_TIMEOUT) for _ in range(CONCURRENT)),
                                       return_exceptions=True)
    failed = [r for r in results if not isinstance(r, echo_pb2.EchoReply) or r.server != "g"]
    assert failed == []


@pytest.fixture
def unreachable_g(servers: tuple[str, str, str]) -> Iterator[str]:
    """The healthy backend behind a link so slow (3 s each way) that it stays CONNECTING for the whole test."""
    host, port = servers[2].rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), 3.0)
    try:
        yield proxy.endpoint
    finally:
        proxy.close()


def _refused() -> str:
    """A loopback address nobody listens on: its subconn goes to TRANSIENT_FAILURE."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return address


def test_sync_wait_for_a_connecting_backend_ends_at_the_deadline(servers, unreachable_g):
    x, y, _ = servers
    with waypost.dial(_target(x, y, unreachable_g), service_config=RETRY) as ch, \
            pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(ch).Unary(Req(**FAIL), timeout=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "not tried yet" in err.value.details() and f"{unreachable_g}=CONNECTING" in err.value.details()


async def test_aio_wait_for_a_connecting_backend_ends_at_the_deadline(servers, unreachable_g):
    x, y, _ = servers
    async with waypost.aio.dial(_target(x, y, unreachable_g), service_config=RETRY) as ch:
        with pytest.raises(grpc.RpcError) as err:
            await echo_pb2_grpc.EchoStub(ch).Unary(Req(**FAIL), timeout=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "not tried yet" in err.value.details()


@pytest.mark.parametrize("wait_for_ready", [False, True])
def test_sync_no_wait_for_a_backend_that_failed_to_connect(servers, wait_for_ready):
    """The only untried backend refuses connections: the third attempt reuses a tried one and its answer ends
    the call (a long deadline, so a wrong wait would end in DEADLINE_EXCEEDED instead)."""
    x, y, _ = servers
    dead = _refused()
    with waypost.dial(_target(x, y, dead), service_config=RETRY) as ch, pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(ch).Unary(Req(**FAIL), timeout=CALL_TIMEOUT, wait_for_ready=wait_for_ready)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert err.value.details().startswith("requested UNAVAILABLE")  # the backend's own answer first


async def test_aio_no_wait_for_a_backend_that_failed_to_connect(servers):
    x, y, _ = servers
    async with waypost.aio.dial(_target(x, y, _refused()), service_config=RETRY) as ch:
        with pytest.raises(grpc.RpcError) as err:
            await echo_pb2_grpc.EchoStub(ch).Unary(Req(**FAIL), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert err.value.details().startswith("requested UNAVAILABLE")


def test_sync_concurrent_first_calls_wait_for_the_slow_healthy_backend(servers, slower_g):
    x, y, _ = servers
    results = _sync_concurrent_first_calls(_target(x, y, slower_g), LONG_LINK)
    assert results == ["g"] * CONCURRENT
