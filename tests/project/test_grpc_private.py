"""waypost._grpc_private on this grpcio, and every fallback it has for a grpcio without the internal it reads.

A fallback is forced by taking the internal away from a real grpcio object (monkeypatch.delattr, then the shim is
re-imported, as on a grpcio release that moved it) or, where the internal is read per call, by giving the caller
the shim's fallback answer; the calls then run through real servers and must end the same way. CI also runs
this file on the oldest grpcio pyproject.toml allows (.ci/oldest_pins)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from tests.channel.support import direct, echo_servers
from waypost import _grpc_private
from waypost.client import aio_call_base, aio_replay, aio_unary_calls

Req = echo_pb2.EchoRequest
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CFG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}
T = 30  # per-call deadline: only a bound


@contextlib.contextmanager
def grpcio_without(owner: Any, name: str) -> Iterator[Any]:
    """The shim as imported on a grpcio whose ``owner`` has no ``name`` (the shim reads it at import; grpcio itself
    gets it back at once: it uses it too); the shim as imported on this grpcio again afterwards."""
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delattr(owner, name)
            shim = importlib.reload(_grpc_private)
        yield shim
    finally:
        importlib.reload(_grpc_private)


def calls(servers: list[Any]) -> int:
    return sum(s.servicer.calls for s in servers)


async def unary_outcomes(servers: list[Any]) -> list[Any]:
    """Through a balanced aio channel: a call that succeeds, one retried until its attempts run out, one
    cancelled here while the server works on it; what each ended with, and the calls each made."""
    out: list[Any] = []
    async with waypost.aio.dial(direct(servers), service_config=CFG) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        before = calls(servers)
        reply = await stub.Unary(Req(message="hi"), timeout=T)
        out.append((reply.message, calls(servers) - before))

        before = calls(servers)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Unary(Req(error_code=UNAVAILABLE.value[0]), timeout=T)
        out.append((failed.value.code(), calls(servers) - before))  # every attempt made, no more

        before = calls(servers)
        call = stub.Unary(Req(delay_ms=3000), timeout=T)
        while calls(servers) == before:  # bounded by the call's deadline
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        out.append((call.cancelled(), calls(servers) - before))  # a local cancel is not retried
    return out


EXPECTED = [("hi", 1), (UNAVAILABLE, 3), (True, 1)]


# ---- the internals, as this grpcio has them --------------------------------------------------------------


async def test_a_plain_channel_call_is_the_class_the_fast_path_takes():
    with echo_servers("a") as srv:
        assert _grpc_private.PLAIN_UNARY_UNARY_CALL is not None
        async with waypost.aio.dial(direct(srv)) as ch:
            await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=T)  # the backend READY: picks need not wait
            call = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="x"), timeout=T)
            assert call._fast is True  # the first attempt runs without a task of waypost's
            assert (await call).message == "x"


async def test_status_and_local_cancel_are_read_from_a_real_call():
    with echo_servers("a") as srv:
        async with grpc.aio.insecure_channel(srv[0].address) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            call = stub.Unary(Req(error_code=UNAVAILABLE.value[0], error_details="down"), timeout=T)
            assert _grpc_private.status_of(call) is None  # not ended yet
            with pytest.raises(grpc.aio.AioRpcError):
                await call
            assert _grpc_private.status_of(call) == (UNAVAILABLE, "down")
            assert _grpc_private.locally_cancelled(call) is False

            slow = stub.Unary(Req(delay_ms=3000), timeout=T)
            while srv[0].servicer.calls < 2:  # bounded by the call's deadline
                await asyncio.sleep(0.005)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert _grpc_private.locally_cancelled(slow) is True


def test_the_calls_end_the_same_with_the_internals_present():
    with echo_servers("a", "b") as srv:
        assert asyncio.run(unary_outcomes(srv)) == EXPECTED


# ---- each fallback, forced ---------------------------------------------------------------------------------


def test_without_grpcio_aio_call_class_every_call_takes_the_task_path(monkeypatch):
    with grpcio_without(grpc.aio._call, "UnaryUnaryCall") as shim:
        assert shim.PLAIN_UNARY_UNARY_CALL is None
        monkeypatch.setattr(aio_unary_calls, "PLAIN_UNARY_UNARY_CALL", shim.PLAIN_UNARY_UNARY_CALL)

        async def first_call_path(srv: list[Any]) -> bool:
            async with waypost.aio.dial(direct(srv)) as ch:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=T)  # READY: picks need not wait
                call = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="x"), timeout=T)
                fast = call._fast
                assert (await call).message == "x"
                return fast

        with echo_servers("a", "b") as srv:
            assert asyncio.run(first_call_path(srv)) is False
            assert asyncio.run(unary_outcomes(srv)) == EXPECTED


def test_without_the_cython_status_the_public_coroutines_give_it(monkeypatch):
    seen: list[Any] = []

    def status_elsewhere(call: Any) -> None:  # what status_of answers when grpcio keeps the status elsewhere
        seen.append(call)
        # (None: the status is not here)

    monkeypatch.setattr(aio_call_base, "status_of", status_elsewhere)
    with echo_servers("a", "b") as srv:
        assert asyncio.run(unary_outcomes(srv)) == EXPECTED
    assert seen  # the fallback was the one asked


async def test_status_of_and_locally_cancelled_answer_none_and_false_on_a_call_without_the_internal():
    # grpc.aio's intercepted call object is a real call that has no _cython_call: what a grpcio that moved it has
    class Passing(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(details, request)

    with echo_servers("a") as srv:
        async with grpc.aio.insecure_channel(srv[0].address, interceptors=[Passing()]) as ch:
            call = echo_pb2_grpc.EchoStub(ch).Unary(Req(error_code=UNAVAILABLE.value[0]), timeout=T)
            with pytest.raises(grpc.aio.AioRpcError):
                await call
            assert not hasattr(call, "_cython_call")
            assert _grpc_private.status_of(call) is None
            assert _grpc_private.locally_cancelled(call) is False
            assert aio_call_base.status_now(call) == (UNAVAILABLE, "requested UNAVAILABLE")  # via the coroutines


def test_without_is_locally_cancelled_a_cancelled_call_is_still_not_retried(monkeypatch):
    monkeypatch.setattr(aio_unary_calls, "locally_cancelled", lambda call: False)  # the fallback's answer
    with echo_servers("a", "b") as srv:
        assert asyncio.run(unary_outcomes(srv)) == EXPECTED


def test_without_execute_batch_error_a_client_stream_write_is_still_retried(monkeypatch):
    from grpc._cython import cygrpc

    with grpcio_without(cygrpc, "ExecuteBatchError") as shim:
        assert shim.EXECUTE_BATCH_ERROR is grpc.aio.AioRpcError
        monkeypatch.setattr(aio_replay, "_ATTEMPT_OVER",
                            (grpc.aio.AioRpcError, asyncio.InvalidStateError, shim.EXECUTE_BATCH_ERROR))

        async def client_streams(srv: list[Any]) -> list[tuple[str, int]]:
            out = []
            async with waypost.aio.dial(direct(srv), service_config=CFG) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                await stub.Unary(Req(), timeout=T)
                while len(ch.balancer.ready_addresses()) < 2:  # bounded by the test's timeout
                    await asyncio.sleep(0.005)
                for _ in range(2):  # round robin over both: one of the two calls starts on a, and is retried on b
                    call = stub.ClientStream(timeout=T)
                    for i in range(4):  # server a fails the call once the stream ends; b answers
                        await call.write(Req(message=f"m{i}", error_code=UNAVAILABLE.value[0], fail_on="a"))
                    await call.done_writing()
                    reply = await call
                    out.append((reply.server, reply.received))
            return out

        with echo_servers("a", "b") as srv:
            assert asyncio.run(client_streams(srv)) == [("b", 4), ("b", 4)]
            assert srv[0].servicer.calls >= 1  # a failed at least one attempt: the replay really ran


def test_without_registered_method_the_keyword_is_not_forwarded(monkeypatch):
    takes = _grpc_private._TAKES_REGISTERED_METHOD
    assert _grpc_private.registered_method_kwargs(True) == ({"_registered_method": True} if takes else {})
    monkeypatch.setattr(_grpc_private, "_TAKES_REGISTERED_METHOD", False)
    assert _grpc_private.registered_method_kwargs(True) == {}
    with echo_servers("a", "b") as srv, waypost.dial(direct(srv)) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)  # newer grpcio-tools' stubs pass _registered_method=True
        assert [stub.Unary(Req(message=str(i)), timeout=T).message for i in range(4)] == ["0", "1", "2", "3"]


class Counting(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        self.methods.append(handler_call_details.method)
        return continuation(handler_call_details)


def test_an_interceptor_is_put_first_on_a_running_grpc_server_keeping_the_applications():
    with echo_servers("a") as srv:
        server = srv[0].server
        app, ours = Counting(), Counting()
        _grpc_private.prepend_server_interceptor(server, app, keep=type(None))  # as if given to grpc.server()
        assert _grpc_private.prepend_server_interceptor(server, ours, keep=Counting) is app  # one of a kind
        other = type("Other", (Counting,), {})()
        assert _grpc_private.prepend_server_interceptor(server, other, keep=type(other)) is other
        with grpc.insecure_channel(srv[0].address) as ch:
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req(message="x"), timeout=T).message == "x"
        assert other.methods == app.methods == ["/waypost.test.Echo/Unary"]
        assert ours.methods == []


def test_without_the_server_pipeline_nothing_is_added_and_mount_says_so(monkeypatch, caplog):
    mount = importlib.import_module("waypost.orca.mount")

    with echo_servers("a") as srv:
        server = srv[0].server
        pipeline = server._state.interceptor_pipeline
        with pytest.MonkeyPatch.context() as mp:
            mp.delattr(server._state, "interceptor_pipeline")
            assert _grpc_private.prepend_server_interceptor(server, Counting(), keep=Counting) is None
            with caplog.at_level(logging.WARNING, logger="waypost.orca"):
                assert mount.mount_waypost_report(server) is None  # no account: reports without call counts
        assert server._state.interceptor_pipeline is pipeline  # untouched
        assert any("unknown grpcio internals" in r.getMessage() for r in caplog.records)
        with grpc.insecure_channel(srv[0].address) as ch:  # the server serves as before
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req(message="x"), timeout=T).message == "x"


class Passing(grpc.UnaryUnaryClientInterceptor):
    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(details, request)


def _ready_within(probe: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds  # a bound only: the test asserts the state, not the time
    while time.monotonic() < deadline:
        if probe(True) == grpc.ChannelConnectivity.READY.value[0]:
            return True
        time.sleep(0.01)
    return False


# grpcio's own subscribe() polling thread may still be in check_connectivity_state when the channel closes ("Channel
# closed!" in that thread, after the test's assertions): grpcio's race, not the fallback's
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_connectivity_probe_reads_grpc_core_and_follows_subscribe_without_it():
    with echo_servers("a") as srv, grpc.insecure_channel(srv[0].address) as ch:
        probe = _grpc_private.connectivity_probe(ch)
        assert probe == ch._channel.check_connectivity_state  # the internal, bound once
        assert _ready_within(probe, T)
        # grpcio's intercepted channel is a real channel without that internal: what a grpcio that moved it has
        wrapped = grpc.intercept_channel(ch, Passing())
        fallback = _grpc_private.connectivity_probe(wrapped)
        assert fallback != ch._channel.check_connectivity_state
        assert _ready_within(fallback, T)


# grpcio's own subscribe() polling thread may still be in check_connectivity_state when the channel closes ("Channel
# closed!" in that thread, after the test's assertions): grpcio's race, not the fallback's
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_without_the_connectivity_internal_a_sync_channel_still_balances(monkeypatch):
    import waypost.channel

    monkeypatch.setattr(waypost.channel, "connectivity_probe", _grpc_private.subscribed_probe)  # the fallback
    with echo_servers("a", "b") as srv, waypost.dial(direct(srv), balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        deadline = time.monotonic() + T  # a bound only
        while len(ch.balancer.ready_addresses()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ch.balancer.ready_addresses()) == 2  # both READY, as subscribe() delivered it
        servers = {stub.Unary(Req(message=str(i)), timeout=T).server for i in range(20)}
        assert servers == {"a", "b"}
