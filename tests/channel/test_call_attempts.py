"""The two ends of every attempt (``MethodBase.begin`` / ``finish``), the retry state a call makes only once an
attempt failed, and the grpc.aio pick wait (``client.aio_wait``), against real in-process gRPC servers."""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2
from harness.waiting import wait_until
from tests.channel.support import direct, echo_servers
from waypost.balancer.base import PickInfo
from waypost.client.aio_wait import AioPickWaiter
from waypost.client.picker_wrapper import PickerSnapshot, PickerWrapper
from waypost.client.retry import PREVIOUS_ATTEMPTS, RetryState
from waypost.client.rpcerror import BalancerRpcError

METHOD = "/waypost.test.Echo/Unary"
Req = echo_pb2.EchoRequest


def test_retry_state_made_after_the_first_attempt_counts_it_sent_and_tried():
    st = RetryState(None, None, random.Random(1), None, "10.0.0.1:1")
    assert st.tried == {"10.0.0.1:1"}
    assert st.metadata([("k", "v")]) == (("k", "v"), (PREVIOUS_ATTEMPTS, "1"))  # the next attempt is a retry
    assert st.metadata(None) == ((PREVIOUS_ATTEMPTS, "2"),)
    fresh = RetryState(None, None, random.Random(1), None)
    assert fresh.tried == set() and fresh.metadata(None) is None  # made before the first attempt


def test_sync_begin_counts_the_attempt_in_flight_until_finish():
    with echo_servers("a") as srv, waypost.dial(direct(srv), balancer="round_robin") as ch:
        m = ch.unary_unary(METHOD, Req.SerializeToString, echo_pb2.EchoReply.FromString)
        assert m(Req(message="x"), timeout=30).server == "a"  # connected
        deadline = time.monotonic() + 30
        tried: set[str] = set()
        res, sc, mc, t0, timeout = m.begin(None, deadline, tried, wait=True)
        assert sc.inflight == 1 and tried == {sc.address} and 0 < timeout <= 30
        assert mc(Req(message="y"), timeout).server == "a"  # the backend's own multicallable
        m.finish(res, sc, t0, grpc.StatusCode.OK)
        assert sc.inflight == 0
        # a retry never keeps the plain pick without waiting: the waiting path avoids the backends tried
        assert m.begin(None, deadline, tried) is None
        # after a failure as after a success, nothing stays in flight
        with pytest.raises(grpc.RpcError):
            m(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]), timeout=30)
        assert m.future(Req(message="z"), timeout=30).result(30).server == "a"
        # (a future's end is reported from its done callback, which may run just after result() returns)
        wait_until(lambda: all(s.inflight == 0 for s in ch.balancer.subconns()), 10)


async def test_aio_calls_leave_nothing_in_flight():
    with echo_servers("a") as srv:
        async with waypost.aio.dial(direct(srv), balancer="round_robin") as ch:
            m = ch.unary_unary(METHOD, Req.SerializeToString, echo_pb2.EchoReply.FromString)
            assert (await m(Req(message="x"), timeout=30)).server == "a"
            with pytest.raises(grpc.aio.AioRpcError):
                await m(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]), timeout=30)
            assert all(s.inflight == 0 for s in ch.balancer.subconns())


async def test_aio_pick_waiter_waits_for_a_change_and_honours_the_deadline():
    pickers = PickerWrapper("t")
    bound = []
    waiter = AioPickWaiter(pickers, lambda: bound.append(True))
    info = PickInfo("/s/m")
    # resolution pending: the pick waits, up to the deadline
    t = time.monotonic()
    with pytest.raises(BalancerRpcError) as ei:
        await waiter.wait_pick(info, time.monotonic() + 0.2, None)
    assert ei.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t >= 0.2
    assert bound  # the channel's loop binding ran before waiting
    # a change wakes the waiting pick at once: here the channel closed, so it fails with CANCELLED
    task = asyncio.ensure_future(waiter.wait_pick(info, None, None))
    await asyncio.sleep(0.05)
    assert not task.done()
    pickers.publish(PickerSnapshot(None, {}, closed=True, resolved=True))
    waiter.changed()
    with pytest.raises(BalancerRpcError) as ei:
        await asyncio.wait_for(task, 0.5)  # well within the 1 s re-check of a waiter that missed the change
    assert ei.value.code() is grpc.StatusCode.CANCELLED
