"""pick_first holds one connection, as gRPC's does: it connects to the first address, tries the next when that
fails (or after the attempt delay: tests/balancer/test_pick_first_happy_eyeballs.py), and keeps no connection to the others
once one works. Real Echo servers in child processes, one of them killed; the connections are counted on the
channel (held subconns and those still draining)."""

from __future__ import annotations

import asyncio
import socket

import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many
from harness.waiting import wait_until
from tests.balancer.support import FakeClock, bs
from waypost.balancer.pick_first import CONNECTION_ATTEMPT_DELAY, PickFirstPolicy
from waypost.types import CONNECTING, READY, TRANSIENT_FAILURE

Req = echo_pb2.EchoRequest


@pytest.fixture
def procs():
    ps = spawn_many(["first", "second", "third"])
    yield ps
    for p in ps:
        p.close()


def _held(ch) -> list[str]:
    """The addresses the channel has a backend channel to: held subconns, then those still draining."""
    return [sc.address for sc in ch.balancer.subconns()] + [sc.address for sc in ch.balancer.draining()]


def _dead_address() -> str:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_one_backend_channel_then_the_second_when_the_first_is_killed(procs):
    first, second, _third = procs
    target = "direct:///" + ",".join(p.address for p in procs)
    with waypost.dial(target, balancer="pick_first", retries=3) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert {stub.Unary(Req(), timeout=20, wait_for_ready=True).server for _ in range(10)} == {"first"}
        assert _held(ch) == [first.address]  # never a connection to the other two
        first.kill()
        # every call succeeds across the kill: one that hits the dead backend is retried (retries=3) and waits
        # for the second one's new connection (not wait_for_ready: that would wait on the dead one's channel)
        got = [stub.Unary(Req(), timeout=20).server for _ in range(30)]
        assert "second" in got and "third" not in got, got
        wait_until(lambda: [sc.address for sc in ch.balancer.subconns()] == [second.address], 20,
                   what="the channel holds the second backend only")
        wait_until(lambda: _held(ch) == [second.address], 20, what="the first backend's channel closed")
        assert {stub.Unary(Req(), timeout=20).server for _ in range(10)} == {"second"}
        assert _held(ch) == [second.address]


def test_an_unreachable_first_address_is_tried_then_dropped(procs):
    dead = _dead_address()
    target = "direct:///" + ",".join([dead] + [p.address for p in procs])
    with waypost.dial(target, balancer="pick_first") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req(), timeout=20, wait_for_ready=True).server == "first"
        wait_until(lambda: _held(ch) == [procs[0].address], 20, what="only the working backend held")


def test_an_aio_channel_holds_one_backend_channel_too(procs):
    async def main(target: str) -> None:
        async with waypost.aio.dial(target, balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            got = {(await stub.Unary(Req(), timeout=20, wait_for_ready=True)).server for _ in range(5)}
            assert got == {"first"}
            assert _held(ch) == [procs[0].address]

    asyncio.run(main("direct:///" + ",".join(p.address for p in procs)))


def test_other_policies_still_connect_to_every_backend(procs):
    target = "direct:///" + ",".join(p.address for p in procs)
    with waypost.dial(target, balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        stub.Unary(Req(), timeout=20, wait_for_ready=True)
        assert sorted(_held(ch)) == sorted(p.address for p in procs)


# ---- the policy's choice, without a channel -------------------------------------------------------------


def test_connections_first_address_then_the_next_after_a_failure():
    policy = PickFirstPolicy(clock=FakeClock())  # the clock never moves: no attempt delay runs out here
    backends = bs("a:1", "b:1", "c:1")
    assert list(policy.connections(backends, {})) == ["a:1"]
    assert list(policy.connections(backends, {"a:1": CONNECTING})) == ["a:1"]
    # a failed: keep it (it retries) and try b
    assert list(policy.connections(backends, {"a:1": TRANSIENT_FAILURE})) == ["a:1", "b:1"]
    # b works: only b
    policy.build(bs("b:1"))
    assert list(policy.connections(backends, {"a:1": TRANSIENT_FAILURE, "b:1": READY})) == ["b:1"]
    # a connects again meanwhile: b, in use, stays the one (sticky)
    assert list(policy.connections(backends, {"a:1": READY, "b:1": READY})) == ["b:1"]
    # b, in use, fails after a was closed: b keeps retrying while a is tried again
    assert list(policy.connections(backends, {"b:1": TRANSIENT_FAILURE})) == ["a:1", "b:1"]
    # every address failed: all of them retry, the first to connect wins
    failed = dict.fromkeys(["a:1", "b:1", "c:1"], TRANSIENT_FAILURE)
    assert list(policy.connections(backends, failed)) == ["a:1", "b:1", "c:1"]
    assert policy.connections_timer() is None  # nothing left to start: only a state change moves it on


def test_connections_the_one_in_use_waiting_for_health_is_not_replaced_within_the_delay():
    clock = FakeClock()
    policy = PickFirstPolicy(clock=clock)
    backends = bs("a:1", "b:1")
    policy.build(bs("b:1"))
    assert list(policy.connections(backends, {"b:1": READY})) == ["b:1"]
    # b, in use, waits for a health answer again: it stays the one tried, a is not connected for it ...
    assert list(policy.connections(backends, {"b:1": CONNECTING})) == ["b:1"]
    assert policy.connections_timer() == pytest.approx(CONNECTION_ATTEMPT_DELAY)
    # ... until the attempt delay has passed without an answer: then a is tried too, b keeps its connection
    clock.now += CONNECTION_ATTEMPT_DELAY
    assert list(policy.connections(backends, {"b:1": CONNECTING})) == ["a:1", "b:1"]
    # both usable: b, in use, stays the one
    assert list(policy.connections(backends, {"a:1": READY, "b:1": READY})) == ["b:1"]


def test_connections_follow_the_shuffled_order_and_keep_its_ranks():
    addrs = [f"10.0.0.{i}:80" for i in range(6)]
    policy = PickFirstPolicy({"shuffleAddressList": True})
    first = policy.order(bs(addrs))[0].address
    assert list(policy.connections(bs(addrs), {})) == [first]
    policy.build(bs(addrs[:2]))  # the READY subset reaches build: the others keep their ranks
    assert policy.order(bs(addrs))[0].address == first
