"""wait_for_ready means "wait for a usable backend", not "wait for the backend picked first": a call picked onto a
backend that was just killed (before the channel noticed) goes to another backend instead of waiting on the dead
one's own connection until its deadline (real server processes, SIGKILL)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many
from harness.waiting import wait_until

Req = echo_pb2.EchoRequest
CALLS = 40
DEADLINE = 20.0  # far longer than a failover; only a call stuck on the dead backend reaches it


def assert_left_the_dead_backend(failures: list[tuple]) -> None:
    """No call waited on the dead backend or failed before reaching one. One race is gRPC's, not ours: a call
    written onto the dead backend's connection before grpc's poller read its close fails as sent ("Stream
    removed"/"Socket closed": it may have reached a server, so only an explicit retry policy may repeat it).
    The next call sees the close, so at most one call can lose that race."""
    sent = [f for f in failures if f[0] is grpc.StatusCode.UNAVAILABLE
            and any(m in (f[1] or "").lower() for m in ("stream removed", "socket closed"))]
    assert len(sent) <= 1 and len(failures) == len(sent), failures


@pytest.fixture
def pair():
    procs = spawn_many(["a", "b"])
    try:
        yield procs
    finally:
        for p in procs:
            p.close()


def test_sync_wait_for_ready_calls_leave_a_killed_backend(pair):
    a, b = pair
    with waypost.dial(f"direct:///{a.address},{b.address}", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20, what="both backends READY")
        served = {stub.Unary(Req(), timeout=5).server for _ in range(10)}
        assert served == {"a", "b"}
        a.kill()  # SIGKILL: the channel still holds a READY connection to it for a moment
        failures = []
        for _ in range(CALLS):
            try:
                assert stub.Unary(Req(), timeout=DEADLINE, wait_for_ready=True).server == "b"
            except grpc.RpcError as e:
                failures.append((e.code(), e.details()))
        assert_left_the_dead_backend(failures)


def test_aio_wait_for_ready_calls_leave_a_killed_backend(pair):
    a, b = pair

    async def main() -> list[tuple]:
        async with waypost.aio.dial(f"direct:///{a.address},{b.address}", balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            served: set[str] = set()
            for _ in range(400):  # until both are READY (bounded): the first calls may all go to one
                served.add((await stub.Unary(Req(), timeout=5)).server)
                if served == {"a", "b"}:
                    break
                await asyncio.sleep(0.01)
            assert served == {"a", "b"}
            a.kill()
            failures = []
            for _ in range(CALLS):
                try:
                    reply = await stub.Unary(Req(), timeout=DEADLINE, wait_for_ready=True)
                    assert reply.server == "b"
                except grpc.RpcError as e:
                    failures.append((e.code(), e.details()))
            return failures

    assert_left_the_dead_backend(asyncio.run(main()))


def test_sync_wait_for_ready_stream_leaves_a_killed_backend(pair):
    a, b = pair
    with waypost.dial(f"direct:///{a.address},{b.address}", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20, what="both backends READY")
        assert {stub.Unary(Req(), timeout=5).server for _ in range(10)} == {"a", "b"}
        a.kill()
        failures = []
        for _ in range(CALLS // 4):
            try:
                replies = list(stub.ServerStream(Req(message="x"), timeout=DEADLINE, wait_for_ready=True))
                assert replies and all(r.server == "b" for r in replies)
            except grpc.RpcError as e:
                failures.append((e.code(), e.details()))
        assert_left_the_dead_backend(failures)
