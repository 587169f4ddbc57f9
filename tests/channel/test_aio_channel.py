"""waypost.aio.dial against real gRPC servers, with generated stubs in asyncio."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time

import grpc
import grpc.aio
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many
from tests.channel.support import (
    RECORDER,
    direct,
    echo_servers,
    recording,  # noqa: F401  # fixture used by pytestmark
)

Req = echo_pb2.EchoRequest
pytestmark = pytest.mark.usefixtures("recording")  # the test_recording policy, for this module only
SERVICE = "waypost.test.Echo"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
_n = itertools.count()

RETRY = {
    "loadBalancingConfig": [{"test_recording": {}}],
    "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}


async def until(cond, timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


async def test_every_call_kind_through_generated_stub():
    with echo_servers("a", "b") as srv:
        async with waypost.aio.dial(direct(srv), balancer="round_robin") as ch:
            assert isinstance(ch, grpc.aio.Channel)
            stub = echo_pb2_grpc.EchoStub(ch)
            assert (await stub.Unary(Req(message="hi"))).message == "hi"
            call = stub.Unary(Req())
            reply = await call
            assert reply.server in {"a", "b"} and await call.code() == grpc.StatusCode.OK
            assert await call.details() in ("", None)
            replies = [r async for r in stub.ServerStream(Req(count=3))]
            assert [r.index for r in replies] == [0, 1, 2]
            stream = stub.ServerStream(Req(count=2))
            assert (await stream.read()).index == 0 and (await stream.read()).index == 1
            assert await stream.read() is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK
            reply = await stub.ClientStream(iter([Req(message=str(i)) for i in range(4)]))
            assert reply.received == 4 and reply.message == "3"

            async def agen():
                for i in range(2):
                    yield Req(message=str(i))

            assert (await stub.ClientStream(agen())).received == 2
            writer = stub.ClientStream()
            await writer.write(Req(message="w1"))
            await writer.write(Req(message="w2"))
            await writer.done_writing()
            assert (await writer).received == 2
            assert [r.message async for r in stub.BidiStream(iter([Req(message=str(i)) for i in range(3)]))] == \
                ["0", "1", "2"]
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]))
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND
            await ch.channel_ready()
            assert ch.get_state() == grpc.ChannelConnectivity.READY


async def test_seed_experiment_pick_first_and_round_robin():
    with echo_servers("a", "b") as srv:
        async with waypost.aio.dial(direct(srv), balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            got = [(await stub.Unary(Req())).server for _ in range(4)]
            assert len(got) == 4 and len(set(got)) == 1, got  # whichever connected first, then only it
        async with waypost.aio.dial(direct(srv), balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            await until(lambda: len(ch.balancer.ready_addresses()) == 2)
            got = [(await stub.Unary(Req())).server for _ in range(4)]
            assert got[0] != got[1] and got[0::2] == [got[0]] * 2 and got[1::2] == [got[1]] * 2


class _Counting(grpc.aio.UnaryUnaryClientInterceptor):
    # (grpc.aio files an interceptor under ONE call kind, the first base it matches, so one kind here)
    def __init__(self) -> None:
        self.seen = 0

    async def intercept_unary_unary(self, continuation, details, request):
        self.seen += 1
        return await continuation(details, request)


async def test_outcomes_reported_once_per_call_with_and_without_interceptors():
    with echo_servers("a", "b") as srv:
        for interceptors in ([], [_Counting()]):
            RECORDER.clear()
            async with waypost.aio.dial(direct(srv), balancer="test_recording",
                                        interceptors=interceptors) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                await stub.Unary(Req())
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]))
                [r async for r in stub.ServerStream(Req(count=2))]
                with pytest.raises(grpc.aio.AioRpcError):
                    [r async for r in stub.ServerStream(Req(count=2, error_code=13, error_after=1))]
                await stub.ClientStream(iter([Req()]))
                await until(lambda: len(RECORDER.outcomes) == 5, 10, "5 outcomes")
                assert sorted(o.code.name for _, o in RECORDER.outcomes) == \
                    sorted(["OK", "NOT_FOUND", "OK", "INTERNAL", "OK"])
                assert len(RECORDER.picks) == 5
            if interceptors:
                assert interceptors[0].seen == 2


async def test_retries_move_to_another_backend():
    with echo_servers("a", "b", "c") as srv:
        async with waypost.aio.dial(direct(srv), service_config=RETRY) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            await until(lambda: len(ch.balancer.ready_addresses()) == 3)
            for _ in range(4):
                RECORDER.clear()
                reply = await stub.Unary(Req(error_code=UNAVAILABLE, fail_on="a,b"))
                assert reply.server == "c"
                tried = [a for a, _ in RECORDER.outcomes]
                assert len(tried) == len(set(tried))
                assert reply.previous_attempts == ("" if len(tried) == 1 else str(len(tried) - 1))
            replies = [r async for r in stub.ServerStream(Req(count=2, error_code=UNAVAILABLE, fail_on="a,b"))]
            assert [r.server for r in replies] == ["c", "c"]
            reply = await stub.ClientStream(iter([Req(error_code=UNAVAILABLE, fail_on="a,b")] * 3))
            assert reply.server == "c" and reply.received == 3
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Unary(Req(error_code=UNAVAILABLE))
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_no_ready_backend_fails_fast_or_waits_for_ready():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with waypost.aio.dial(f"direct:///127.0.0.1:{port}", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Unary(Req(), timeout=30)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and f"127.0.0.1:{port}" in ei.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Unary(Req(), timeout=0.3, wait_for_ready=True)
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_first_call_on_fresh_channel_never_fails():
    with echo_servers("a", "b") as srv:
        for policy in ("round_robin", "p2c_ewma", "pick_first"):
            async with waypost.aio.dial(direct(srv), balancer=policy) as ch:
                assert (await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=30)).server in {"a", "b"}


async def test_hash_key_in_tasks():
    with echo_servers("a", "b", "c") as srv:
        async with waypost.aio.dial(direct(srv), balancer="consistent_hash") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            with waypost.hash_key("warmup"):
                await stub.Unary(Req())
            await until(lambda: len(ch.balancer.ready_addresses()) == 3)

            async def user(key: str) -> set[str]:
                with waypost.hash_key(key):
                    return {(await stub.Unary(Req())).server for _ in range(5)}

            results = await asyncio.gather(*(user(f"user-{i}") for i in range(8)))
            assert all(len(r) == 1 for r in results)


async def test_health_not_serving_excluded():
    cfg = {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": SERVICE}}
    with echo_servers("a", "b") as srv:
        for s in srv:
            s.health.set(SERVICE, 1)
        async with waypost.aio.dial(direct(srv), service_config=cfg) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            await until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
            srv[0].health.set(SERVICE, 2)
            await until(lambda: ch.balancer.ready_addresses() == [srv[1].address], 30)
            assert {(await stub.Unary(Req())).server for _ in range(8)} == {"b"}


async def test_memory_registry_target_follows_registrations():
    name = f"aio{os.getpid()}x{next(_n)}"
    registry = waypost.connect(f"memory://{name}")
    with echo_servers("a", "b") as (a, b):
        pa = waypost.Publisher(registry, "svc.rpc", a.address)
        pb = waypost.Publisher(registry, "svc.rpc", b.address)
        await asyncio.to_thread(pa.start)
        try:
            async with waypost.aio.dial(f"memory://{name}/?key=svc.rpc", balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert (await stub.Unary(Req(), timeout=20)).server == "a"
                await asyncio.to_thread(pb.start)
                await until(lambda: len(ch.balancer.ready_addresses()) == 2, 30)
                assert {(await stub.Unary(Req())).server for _ in range(6)} == {"a", "b"}
                await asyncio.to_thread(pa.stop)
                await until(lambda: [sc.address for sc in ch.balancer.subconns()] == [b.address], 30)
                assert {(await stub.Unary(Req())).server for _ in range(6)} == {"b"}
        finally:
            await asyncio.to_thread(pa.stop)
            await asyncio.to_thread(pb.stop)


async def test_sigkill_under_load_with_retry_policy_loses_nothing():
    cfg = dict(RETRY, loadBalancingConfig=[{"round_robin": {}}])
    procs = await asyncio.to_thread(spawn_many, ["q0", "q1", "q2"])
    try:
        async with waypost.aio.dial(direct(procs), service_config=cfg) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req(), timeout=30)
            await until(lambda: len(ch.balancer.ready_addresses()) == 3, 30)
            ok, failed = [], []
            stop_at = time.monotonic() + 2.0

            async def worker():
                while time.monotonic() < stop_at:
                    try:
                        ok.append((time.monotonic(), (await stub.Unary(Req(delay_ms=3), timeout=20)).server))
                    except grpc.aio.AioRpcError as e:
                        failed.append(e)

            tasks = [asyncio.ensure_future(worker()) for _ in range(8)]
            await until(lambda: len(ok) > 50, 20)
            procs[0].kill()
            await asyncio.gather(*tasks)
            assert failed == []
            assert len(ok) > 100
    finally:
        for p in procs:
            p.close()


async def test_cancel_and_deadline_are_reported():
    with echo_servers("a") as srv:
        async with waypost.aio.dial(direct(srv), balancer="test_recording") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            RECORDER.clear()
            call = stub.Unary(Req(delay_ms=2000))
            await until(lambda: any(sc.inflight for sc in ch.balancer.subconns()), 10)
            assert call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert call.cancelled() and await call.code() == grpc.StatusCode.CANCELLED
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Unary(Req(delay_ms=2000), timeout=0.2)
            assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: len(RECORDER.outcomes) == 2, 10)
            assert [o.code for _, o in RECORDER.outcomes] == [grpc.StatusCode.CANCELLED,
                                                              grpc.StatusCode.DEADLINE_EXCEEDED]
            assert all(sc.inflight == 0 for sc in ch.balancer.subconns())


async def test_dial_outside_a_running_loop_binds_on_first_use():
    with echo_servers("a") as srv:
        ch = await asyncio.to_thread(waypost.aio.dial, direct(srv), balancer="round_robin")
        try:
            assert (await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)).server == "a"
        finally:
            await ch.close()


async def test_stream_not_retried_after_first_message():
    with echo_servers("a", "b") as srv:
        async with waypost.aio.dial(direct(srv), service_config=RETRY) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            RECORDER.clear()
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                async for r in stub.ServerStream(Req(count=3, error_code=UNAVAILABLE, error_after=1)):
                    got.append(r.index)
            assert got == [0] and ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert len(RECORDER.picks) == 1  # a retry would have been picked before the error reached us
            await until(lambda: len(RECORDER.outcomes) == 1, 10)


RETRY_CANCELLED = {
    "loadBalancingConfig": [{"test_recording": {}}],
    "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}],
}


async def test_unary_call_object_behaves_as_grpc_aio_whether_or_not_it_retries():
    """A unary call whose first attempt starts at once runs without a task of ours until it is retried:
    its Call API (done, cancelled, code, details, add_done_callback, cancel) must not tell the difference."""
    with echo_servers("a", "b", "c") as srv:
        async with waypost.aio.dial(direct(srv), service_config=RETRY_CANCELLED) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req())
            await until(lambda: len(ch.balancer.ready_addresses()) == 3)

            # success: one callback, after the end, with the call object itself
            seen = []
            call = stub.Unary(Req(message="ok", delay_ms=50))
            call.add_done_callback(seen.append)
            assert not call.done() and not call.cancelled()
            assert (await call).message == "ok"
            assert call.done() and not call.cancelled() and seen == [call]
            assert await call.code() == grpc.StatusCode.OK and await call.details() in ("", None)
            late = []
            call.add_done_callback(late.append)  # on a finished call: called (at once, or soon as asyncio does)
            await until(lambda: late == [call], 5, "the late callback")

            # a retried call: the callback waits for the last attempt, awaiting gives the retry's reply
            for _ in range(3):
                RECORDER.clear()
                seen = []
                call = stub.Unary(Req(error_code=UNAVAILABLE, fail_on="a,b", delay_ms=20))
                call.add_done_callback(seen.append)
                reply = await call
                assert reply.server == "c" and seen == [call] and call.done()
                assert await call.code() == grpc.StatusCode.OK
                assert [o.code.name for _, o in RECORDER.outcomes][-1] == "OK"

            # a failure that is not retried: grpc.aio's error, code and details
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0], error_details="nope"))
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND and ei.value.details() == "nope"
            call = stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0], error_details="nope"))
            assert await call.code() == grpc.StatusCode.NOT_FOUND and await call.details() == "nope"
            assert call.done() and not call.cancelled()

            # cancel(): never retried, even with CANCELLED in the policy; the attempt is reported once
            RECORDER.clear()
            seen = []
            call = stub.Unary(Req(delay_ms=3000))
            call.add_done_callback(seen.append)
            await until(lambda: any(sc.inflight for sc in ch.balancer.subconns()), 10)
            assert call.cancel() and call.cancelled() and call.done()
            assert not call.cancel()  # already over
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await call.code() == grpc.StatusCode.CANCELLED and seen == [call]
            await until(lambda: len(RECORDER.outcomes) == 1, 10)
            assert [o.code for _, o in RECORDER.outcomes] == [grpc.StatusCode.CANCELLED]

            # the awaiting task cancelled (a timeout around the await): the call ends, not retried either
            RECORDER.clear()
            call = stub.Unary(Req(delay_ms=3000))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(call, 0.3)
            assert call.cancelled() and await call.code() == grpc.StatusCode.CANCELLED
            await until(lambda: len(RECORDER.outcomes) == 1, 10)
            await asyncio.sleep(0.2)
            assert [o.code for _, o in RECORDER.outcomes] == [grpc.StatusCode.CANCELLED]
            assert all(sc.inflight == 0 for sc in ch.balancer.subconns())
