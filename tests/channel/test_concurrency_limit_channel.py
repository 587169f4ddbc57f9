"""The adaptive concurrency limit (``concurrencyLimit``) through real channels and real gRPC servers that hold each
call until the test lets it go: a backend at its limit is sent no more calls, a call waits while every backend is at
its limit and goes through when one frees, its deadline bounds the wait; sync and grpc.aio channels. Assertions on
counts and codes only; every wait bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until

Req = echo_pb2.EchoRequest
HOLD = 30.0  # seconds a held call waits for the test at most (a failing test must not hang)
# limit 2 that never grows (max 2): the counts below are exact
CONFIG = {"loadBalancingConfig": [{"peak_ewma": {"concurrencyLimit": {"initial": 2, "min": 1, "max": 2}}}]}


class HeldEcho(EchoServicer):
    """Echo whose calls each wait for a ``let_go`` (bounded by ``HOLD``); counts its calls in flight."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.inflight = 0

    def _sleep(self, req: echo_pb2.EchoRequest) -> None:
        with self.lock:
            self.inflight += 1
        try:
            self.gate.acquire(timeout=HOLD)
        finally:
            with self.lock:
                self.inflight -= 1

    def let_go(self, n: int = 1) -> None:
        self.gate.release(n)


@contextmanager
def held_servers(*names: str) -> Iterator[tuple[list[HeldEcho], str]]:
    servers, servicers = [], []
    try:
        for n in names:
            srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
            svc = HeldEcho(n)
            echo_pb2_grpc.add_EchoServicer_to_server(svc, srv)
            port = srv.add_insecure_port("127.0.0.1:0")
            srv.start()
            servers.append((srv, port))
            servicers.append(svc)
        yield servicers, "direct:///" + ",".join(f"127.0.0.1:{p}" for _, p in servers)
    finally:
        for svc in servicers:
            svc.let_go(1000)
        for srv, _ in servers:
            srv.stop(0).wait(10)


def test_sync_a_backend_at_its_limit_gets_no_more_and_calls_wait_until_one_frees():
    with held_servers("a", "b") as ((a, b), target), waypost.dial(target, service_config=CONFIG) as ch, \
            ThreadPoolExecutor(8) as pool:
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30, "both backends READY")
        stub = echo_pb2_grpc.EchoStub(ch)

        def call(_: Any = None) -> str:
            return str(stub.Unary(Req(), timeout=HOLD).server)

        first = [pool.submit(call) for _ in range(4)]
        wait_until(lambda: a.inflight == 2 and b.inflight == 2, 30, "two calls held at each backend")
        waiting = pool.submit(call)  # both at their limit of 2: it waits in the client
        with pytest.raises(grpc.RpcError) as e:
            stub.Unary(Req(), timeout=0.3)  # waits too, until its deadline: never sent
        assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "while waiting for a READY backend" in e.value.details()
        assert (a.calls, b.calls) == (2, 2)
        a.let_go(1)  # one of a's calls ends: a is under its limit again, b is not
        wait_until(lambda: a.calls == 3, 30, "the waiting call sent to a")
        assert b.calls == 2
        a.let_go(10)
        b.let_go(10)
        assert waiting.result(HOLD) == "a"
        assert sorted(f.result(HOLD) for f in first) == ["a", "a", "b", "b"]


def test_sync_without_the_limit_nothing_waits():
    cfg = {"loadBalancingConfig": [{"peak_ewma": {}}]}
    with held_servers("a") as ((a,), target), waypost.dial(target, service_config=cfg) as ch, \
            ThreadPoolExecutor(8) as pool:
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 1, 30, "the backend READY")
        stub = echo_pb2_grpc.EchoStub(ch)
        calls = [pool.submit(lambda: stub.Unary(Req(), timeout=HOLD)) for _ in range(5)]
        wait_until(lambda: a.inflight == 5, 30, "all five calls at the backend")
        a.let_go(5)
        assert all(f.result(HOLD).server == "a" for f in calls)


async def _until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # 30 s at most
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_aio_calls_wait_on_the_loop_while_every_backend_is_at_its_limit():
    with held_servers("a", "b") as ((a, b), target):
        async with waypost.aio.dial(target, service_config=CONFIG) as ch:
            await _until(lambda: len(ch.balancer.ready_addresses()) == 2, "both backends READY")
            stub = echo_pb2_grpc.EchoStub(ch)

            async def call() -> str:
                return str((await stub.Unary(Req(), timeout=HOLD)).server)

            first = [asyncio.ensure_future(call()) for _ in range(4)]
            await _until(lambda: a.inflight == 2 and b.inflight == 2, "two calls held at each backend")
            waiting = asyncio.ensure_future(call())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Unary(Req(), timeout=0.3)
            assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "while waiting for a READY backend" in (e.value.details() or "")
            assert (a.calls, b.calls) == (2, 2)
            assert not waiting.done()
            b.let_go(1)  # one of b's calls ends: b is under its limit again, a is not
            await _until(lambda: b.calls == 3, "the waiting call sent to b")
            assert a.calls == 2
            a.let_go(10)
            b.let_go(10)
            assert await asyncio.wait_for(waiting, HOLD) == "b"
            assert sorted(await asyncio.wait_for(asyncio.gather(*first), HOLD)) == ["a", "a", "b", "b"]
