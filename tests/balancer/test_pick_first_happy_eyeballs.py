"""pick_first gets past a first address that never answers (gRFC A61 "Happy Eyeballs").

Target ``direct:///BH,RESET,GARBAGE,A,B``: BH accepts TCP connections and never speaks HTTP/2 (black hole),
RESET resets them, GARBAGE answers with bytes that are not HTTP/2 (plain sockets, harness.backends.broken_listeners),
A and B are real gRPC Echo servers. While an attempt is still connecting after the attempt delay (250 ms) the
next address is tried too, and a failed attempt moves on at once, so the first call succeeds on A or B within
its 2 s deadline, for every policy, on sync and aio channels, fresh or after the backend in use stopped. Before,
pick_first waited on BH until the deadline. The policy's own decisions are checked on a clock the test moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.broken_listeners import BrokenListener, broken_listeners
from harness.waiting import wait_until
from tests.balancer.support import FakeClock, bs
from tests.channel.support import echo_servers
from waypost.balancer.pick_first import CONNECTION_ATTEMPT_DELAY, PickFirstPolicy
from waypost.balancer.policies import known_policies
from waypost.types import CONNECTING, READY, TRANSIENT_FAILURE

Req = echo_pb2.EchoRequest
DEADLINE = 2.0  # the call's own deadline: BH first, it expired before the fix (it waited on BH)

# every registered policy, and outlier_detection over pick_first (its child keeps its own choices)
POLICY_CONFIGS = [pytest.param({name: {}}, id=name) for name in known_policies()] + [
    pytest.param({"outlier_detection": {"childPolicy": [{"pick_first": {}}]}}, id="outlier_detection-pick_first"),
]


def _config(policy: dict) -> dict:
    return {"loadBalancingConfig": [policy]}


@pytest.fixture(scope="module")
def broken() -> Iterator[list[BrokenListener]]:
    with broken_listeners("black_hole", "reset", "garbage") as ls:
        yield ls


@pytest.fixture(scope="module")
def good() -> Iterator[list]:
    with echo_servers("A", "B") as servers:
        yield servers


def _target(broken, good) -> str:
    return "direct:///" + ",".join([s.address for s in broken] + [s.address for s in good])


def _held(ch) -> list[str]:
    return [sc.address for sc in ch.balancer.subconns()] + [sc.address for sc in ch.balancer.draining()]


# ---- the first call on a fresh channel, every policy ---------------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_CONFIGS)
def test_the_first_sync_call_gets_past_a_black_hole(broken, good, policy):
    black_hole = broken[0]
    before = black_hole.accepted
    with waypost.dial(_target(broken, good), service_config=_config(policy)) as ch, waypost.hash_key("k"):
        reply = echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=DEADLINE)
        assert reply.server in ("A", "B")
        # the black hole was really tried first (every policy connects to it; pick_first starts there)
        wait_until(lambda: black_hole.accepted > before, what="the black hole accepted a connection")
        if "pick_first" in policy:
            used = next(s.address for s in good if s.servicer.name == reply.server)
            # one connection once one works: the attempts still connecting (BH) or failing are closed
            wait_until(lambda: _held(ch) == [used], what="only the backend in use held")


@pytest.mark.parametrize("policy", POLICY_CONFIGS)
def test_the_first_aio_call_gets_past_a_black_hole(broken, good, policy):
    async def main() -> str:
        async with waypost.aio.dial(_target(broken, good), service_config=_config(policy)) as ch:
            with waypost.hash_key("k"):
                return (await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=DEADLINE)).server

    assert asyncio.run(main()) in ("A", "B")


# ---- after the backend in use stops, past the black hole again -------------------------------------------------


def test_a_sync_channel_finds_the_other_backend_past_the_black_hole_after_its_backend_stops(broken):
    with echo_servers("A", "B") as servers:
        by_name = {s.servicer.name: s for s in servers}
        with waypost.dial(_target(broken, servers), balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            first = stub.Unary(Req(), timeout=DEADLINE).server
            in_use = by_name[first]
            other = next(s for s in servers if s is not in_use)
            wait_until(lambda: _held(ch) == [in_use.address], what="only the backend in use held")
            in_use.stop(0)
            # once the channel saw it go (a call racing the stop could fail at once on the dying connection),
            # the next call must find the other backend: a new pass that starts at BH again
            wait_until(lambda: ch.balancer.ready_addresses() == [], what="the stopped backend no longer READY")
            assert stub.Unary(Req(), timeout=DEADLINE).server == other.servicer.name
            wait_until(lambda: _held(ch) == [other.address], what="only the other backend held")


def test_an_aio_channel_finds_the_other_backend_past_the_black_hole_after_its_backend_stops(broken):
    async def main(servers) -> None:
        by_name = {s.servicer.name: s for s in servers}
        async with waypost.aio.dial(_target(broken, servers), balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            in_use = by_name[(await stub.Unary(Req(), timeout=DEADLINE)).server]
            other = next(s for s in servers if s is not in_use)
            in_use.stop(0)
            while ch.balancer.ready_addresses():  # bounded by the poll below: the channel sees the stop
                await asyncio.sleep(0.02)
            assert (await stub.Unary(Req(), timeout=DEADLINE)).server == other.servicer.name

    with echo_servers("A", "B") as servers:
        asyncio.run(asyncio.wait_for(main(servers), 20))


def test_a_call_still_fails_at_its_deadline_when_no_address_answers(broken):
    with waypost.dial("direct:///" + broken[0].address, balancer="pick_first") as ch:
        with pytest.raises(grpc.RpcError) as err:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=0.5)
        assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert f"{broken[0].address}=CONNECTING" in err.value.details()


# ---- the policy's decisions, on a clock the test moves -------------------------------------------------------


def test_the_next_address_starts_when_the_attempt_delay_runs_out():
    clock = FakeClock()
    policy = PickFirstPolicy(clock=clock)
    backends = bs("bh:1", "a:1", "b:1")
    assert list(policy.connections(backends, {})) == ["bh:1"]
    assert policy.connections_timer() == CONNECTION_ATTEMPT_DELAY
    clock.now += CONNECTION_ATTEMPT_DELAY / 2
    assert list(policy.connections(backends, {"bh:1": CONNECTING})) == ["bh:1"]
    assert policy.connections_timer() == pytest.approx(CONNECTION_ATTEMPT_DELAY / 2)
    clock.now += CONNECTION_ATTEMPT_DELAY / 2
    assert policy.connections_timer() == 0.0
    # bh keeps trying; a starts, with a fresh delay of its own
    assert list(policy.connections(backends, {"bh:1": CONNECTING})) == ["bh:1", "a:1"]
    assert policy.connections_timer() == CONNECTION_ATTEMPT_DELAY
    # a is READY first: only a, no timer
    policy.build(bs("a:1"))
    assert list(policy.connections(backends, {"bh:1": CONNECTING, "a:1": READY})) == ["a:1"]
    assert policy.connections_timer() is None


def test_a_failed_attempt_starts_the_next_at_once_and_restarts_the_delay():
    clock = FakeClock()
    policy = PickFirstPolicy(clock=clock)
    backends = bs("bh:1", "reset:1", "garbage:1", "a:1", "b:1")
    assert list(policy.connections(backends, {})) == ["bh:1"]
    clock.now += CONNECTION_ATTEMPT_DELAY
    states = {"bh:1": CONNECTING}
    assert list(policy.connections(backends, states)) == ["bh:1", "reset:1"]
    clock.now += 0.01
    states["reset:1"] = TRANSIENT_FAILURE  # fails while bh still connects: garbage starts now, not after a delay
    assert list(policy.connections(backends, states)) == ["bh:1", "reset:1", "garbage:1"]
    assert policy.connections_timer() == CONNECTION_ATTEMPT_DELAY
    states["garbage:1"] = TRANSIENT_FAILURE
    assert list(policy.connections(backends, states)) == ["bh:1", "reset:1", "garbage:1", "a:1"]
    states["a:1"] = CONNECTING
    assert list(policy.connections(backends, states)) == ["bh:1", "reset:1", "garbage:1", "a:1"]
    # bh, the oldest attempt, connects first: it is the one kept (the first to become usable wins)
    states["bh:1"] = READY
    assert list(policy.connections(backends, states)) == ["bh:1"]


def test_no_timer_when_every_address_has_a_connection():
    clock = FakeClock()
    policy = PickFirstPolicy(clock=clock)
    backends = bs("a:1", "b:1")
    policy.connections(backends, {})
    clock.now += CONNECTION_ATTEMPT_DELAY
    assert list(policy.connections(backends, {"a:1": CONNECTING})) == ["a:1", "b:1"]
    assert policy.connections_timer() is None  # nothing left to start
    clock.now += 10 * CONNECTION_ATTEMPT_DELAY
    assert list(policy.connections(backends, {"a:1": CONNECTING, "b:1": CONNECTING})) == ["a:1", "b:1"]
    # all failed: all retry, the first to connect wins
    failed = {"a:1": TRANSIENT_FAILURE, "b:1": TRANSIENT_FAILURE}
    assert list(policy.connections(backends, failed)) == ["a:1", "b:1"]
    assert policy.connections_timer() is None


def test_the_delay_follows_the_shuffled_order():
    clock = FakeClock()
    addrs = [f"10.0.0.{i}:80" for i in range(5)]
    policy = PickFirstPolicy({"shuffleAddressList": True}, clock=clock)
    order = [b.address for b in policy.order(bs(addrs))]
    states: dict[str, int] = {}
    for i in range(len(addrs)):
        assert list(policy.connections(bs(addrs), states)) == [a for a in order if a in order[: i + 1]]
        states[order[i]] = CONNECTING
        clock.now += CONNECTION_ATTEMPT_DELAY


def test_the_attempt_delay_is_a_setting_of_the_policy():
    clock = FakeClock()
    policy = PickFirstPolicy(clock=clock, connection_attempt_delay=0.0)
    backends = bs("a:1", "b:1", "c:1")
    assert list(policy.connections(backends, {})) == ["a:1"]
    assert list(policy.connections(backends, {"a:1": CONNECTING})) == ["a:1", "b:1"]  # no wait at all
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="connection_attempt_delay must be >= 0"):
            PickFirstPolicy(connection_attempt_delay=bad)
