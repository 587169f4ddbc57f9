"""Hedged calls of ``waypost.aio.dial`` against real gRPC servers: which backend answers, what the losers' servers
saw, how many attempts went out. No timing thresholds: a blocked attempt waits until it is cancelled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest

import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from tests.channel.hedging_support import hedging_config, scripted_servers

Req = echo_pb2.EchoRequest


async def until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.005)


async def _dial(addresses: list[str], config: dict) -> waypost.aio.Channel:
    ch = waypost.aio.dial("direct:///" + ",".join(addresses), service_config=config)
    await until(lambda: len(ch.balancer.ready_addresses()) == len(addresses), what="every backend READY")
    return ch


async def test_unary_hedge_goes_to_another_backend_and_the_loser_is_cancelled():
    with scripted_servers("a", "b", "c") as (addresses, log):
        async with await _dial(addresses, hedging_config()) as ch:
            call = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="block,ok"), timeout=20)
            reply = await call
            first = log.first()
            assert first[1] == 0 and reply.server != first[0] and reply.previous_attempts == "1"
            assert await call.code() == grpc.StatusCode.OK
            await until(lambda: log.of("cancelled") == [first], what="the first attempt's server saw the cancel")


async def test_unary_non_fatal_code_sends_the_next_hedge_at_once_and_fatal_ends_the_call():
    with scripted_servers("a", "b", "c") as (addresses, log):
        async with await _dial(addresses, hedging_config("100s")) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert (await stub.Unary(Req(message="UNAVAILABLE,ok"), timeout=20)).previous_attempts == "1"
            call = stub.Unary(Req(message="NOT_FOUND,ok"), timeout=20)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and await call.code() == grpc.StatusCode.NOT_FOUND
            assert [n for _, n in log.of("start")] == [0, 1, 0]  # the fatal code sent no hedge


async def test_unary_budget_and_throttle_stop_hedges():
    with scripted_servers("a", "b") as (addresses, log):
        async with await _dial(addresses, hedging_config("0.01s", share=0.0)) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(message="block,ok"), timeout=1)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and len(log.of("start")) == 1
        cfg = hedging_config("100s", throttling={"maxTokens": 2, "tokenRatio": 0.1})
        async with await _dial(addresses, cfg) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(message="UNAVAILABLE,ok"), timeout=20)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and len(log.of("start")) == 2


async def test_server_stream_first_message_commits_and_the_loser_is_cancelled():
    with scripted_servers("a", "b", "c") as (addresses, log):
        async with await _dial(addresses, hedging_config()) as ch:
            call = echo_pb2_grpc.EchoStub(ch).ServerStream(Req(message="block,ok"), timeout=20)
            replies = [r async for r in call]
            first = log.first()
            assert [r.index for r in replies] == [0, 1] and len({r.server for r in replies}) == 1
            assert replies[0].server != first[0] and await call.code() == grpc.StatusCode.OK
            await until(lambda: log.of("cancelled") == [first], what="the first attempt's server saw the cancel")
            # a non-fatal status: the next hedge at once (the delay is 50 ms, but the read() API is the same)
            call = echo_pb2_grpc.EchoStub(ch).ServerStream(Req(message="UNAVAILABLE,ok"), timeout=20)
            assert (await call.read()).previous_attempts == "1"
            assert (await call.read()).index == 1 and await call.read() is grpc.aio.EOF


async def test_application_cancel_cancels_every_attempt():
    with scripted_servers("a", "b", "c") as (addresses, log):
        async with await _dial(addresses, hedging_config("0s")) as ch:  # all three attempts at once
            call = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="block"), timeout=20)
            await until(lambda: len(log.of("start")) == 3, what="three attempts started")
            assert call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await call.code() == grpc.StatusCode.CANCELLED
            await until(lambda: len(log.of("cancelled")) == 3, what="every attempt's server saw the cancel")


async def test_no_backend_fails_like_an_unhedged_call():
    with scripted_servers("a") as (addresses, _log):
        pass  # stopped: its port refuses connections now
    async with waypost.aio.dial("direct:///" + addresses[0], service_config=hedging_config()) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Unary(Req(message="ok"), timeout=20)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        call = stub.ServerStream(Req(message="ok"), timeout=20)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and await call.code() == grpc.StatusCode.UNAVAILABLE
