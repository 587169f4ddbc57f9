"""Hedged calls of ``waypost.dial`` against real gRPC servers: which backend answers, what the losers' servers saw,
how many attempts went out. No timing thresholds: a blocked attempt waits until it is cancelled."""

from __future__ import annotations

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.hedging_support import hedging_config, scripted_servers
from tests.channel.support import RECORDER, recording  # noqa: F401  # fixture

Req = echo_pb2.EchoRequest


def _dial(addresses: list[str], config: dict) -> grpc.Channel:
    ch = waypost.dial("direct:///" + ",".join(addresses), service_config=config)
    wait_until(lambda: len(ch.balancer.ready_addresses()) == len(addresses), what="every backend READY")
    return ch


def test_unary_hedge_goes_to_another_backend_and_the_loser_is_cancelled():
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, hedging_config()) as ch:
        reply = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="block,ok"), timeout=20)
        first = log.first()
        assert first[1] == 0 and reply.server != first[0]  # the hedge (attempt 1) answered, elsewhere
        assert reply.previous_attempts == "1"
        wait_until(lambda: log.of("cancelled") == [first], what="the first attempt's server saw the cancellation")
        assert len({s for s, _ in log.of("start")}) == len(log.of("start"))  # never the same backend twice


def test_unary_non_fatal_code_sends_the_next_hedge_at_once():
    # a 100 s hedging delay: only a non-fatal status can bring the hedge within the call's 20 s
    cfg = hedging_config("100s")
    with scripted_servers("a", "b") as (addresses, log), _dial(addresses, cfg) as ch:
        reply = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="UNAVAILABLE,ok"), timeout=20)
        assert reply.previous_attempts == "1"
        assert [n for _, n in log.of("start")] == [0, 1]


def test_unary_fatal_code_ends_the_call_and_cancels_the_others():
    cfg = hedging_config("0s", non_fatal=("UNAVAILABLE",))  # every attempt at once
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, cfg) as ch:
        # the first attempt fails INVALID_ARGUMENT (fatal); the hedges block until cancelled
        with pytest.raises(grpc.RpcError) as err:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="INVALID_ARGUMENT,block"), timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        wait_until(lambda: set(log.of("cancelled")) == {e for e in log.of("start") if e[1] > 0},
                   what="each hedge's server saw it cancelled")


def test_all_non_fatal_failures_return_the_last_one():
    cfg = hedging_config("100s", max_attempts=3)
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, cfg) as ch:
        with pytest.raises(grpc.RpcError) as err:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="UNAVAILABLE"), timeout=20)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "retries=" not in err.value.details()
        assert sorted(n for _, n in log.of("start")) == [0, 1, 2]  # maxAttempts, each on its own backend
        assert len({s for s, _ in log.of("start")}) == 3


def test_no_hedge_once_every_backend_was_tried():
    cfg = hedging_config("100s", max_attempts=5)
    with scripted_servers("a", "b") as (addresses, log), _dial(addresses, cfg) as ch:
        with pytest.raises(grpc.RpcError):
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="UNAVAILABLE"), timeout=20)
        assert len(log.of("start")) == 2  # two backends: two attempts, though maxAttempts is 5


def test_pushback_negative_stops_hedging_and_non_negative_delays_it():
    cfg = hedging_config("100s")
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, cfg) as ch:
        with pytest.raises(grpc.RpcError):
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="pushback:-1,ok"), timeout=20)
        assert len(log.of("start")) == 1  # the server said: no more attempts
        # pushback 0 ms: the next hedge at once (rather than after the 100 s delay)
        reply = echo_pb2_grpc.EchoStub(ch).Unary(Req(message="pushback:0,ok"), timeout=20)
        assert reply.previous_attempts == "1"


def test_extra_share_cap_stops_hedges():
    cfg = hedging_config("0.01s", share=0.0)
    with scripted_servers("a", "b") as (addresses, log), _dial(addresses, cfg) as ch:
        with pytest.raises(grpc.RpcError) as err:  # the first attempt blocks; no hedge may go: the deadline ends it
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="block,ok"), timeout=1)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(log.of("start")) == 1
        assert ch.config.hedging.share.hedges == 0


def test_retry_throttle_stops_hedges():
    # 2 tokens, the threshold is 1: the first non-fatal failure takes one, leaving 1: no hedge (A6)
    cfg = hedging_config("100s", throttling={"maxTokens": 2, "tokenRatio": 0.1})
    with scripted_servers("a", "b") as (addresses, log), _dial(addresses, cfg) as ch:
        with pytest.raises(grpc.RpcError) as err:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(message="UNAVAILABLE,ok"), timeout=20)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(log.of("start")) == 1


def test_future_and_with_call_are_hedged():
    with scripted_servers("a", "b") as (addresses, log), _dial(addresses, hedging_config()) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        reply, call = stub.Unary.with_call(Req(message="block,ok"), timeout=20)
        assert reply.previous_attempts == "1" and call.code() == grpc.StatusCode.OK
        assert stub.Unary.future(Req(message="block,ok"), timeout=20).result(timeout=20).previous_attempts == "1"
        wait_until(lambda: len(log.of("cancelled")) == 2, what="both first attempts cancelled")


def test_server_stream_first_message_commits_and_the_loser_is_cancelled():
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, hedging_config()) as ch:
        stream = echo_pb2_grpc.EchoStub(ch).ServerStream(Req(message="block,ok"), timeout=20)
        replies = list(stream)
        first = log.first()
        assert [r.index for r in replies] == [0, 1] and {r.server for r in replies} != {first[0]}
        assert len({r.server for r in replies}) == 1 and stream.code() == grpc.StatusCode.OK
        wait_until(lambda: log.of("cancelled") == [first], what="the first attempt's server saw the cancellation")


def test_server_stream_non_fatal_then_answer():
    with scripted_servers("a", "b") as (addresses, _log), _dial(addresses, hedging_config("100s")) as ch:
        replies = list(echo_pb2_grpc.EchoStub(ch).ServerStream(Req(message="UNAVAILABLE,ok"), timeout=20))
        assert [r.previous_attempts for r in replies] == ["1", "1"]


@pytest.mark.usefixtures("recording")
def test_hedges_are_picks_that_end_with_done():
    """Each attempt is a pick of the policy and ends with its done(): the policy's in-flight count is kept."""
    cfg = hedging_config()
    cfg["loadBalancingConfig"] = [{"test_recording": {}}]
    with scripted_servers("a", "b", "c") as (addresses, log), _dial(addresses, cfg) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        RECORDER.clear()
        for _ in range(3):
            assert stub.Unary(Req(message="block,ok"), timeout=20).previous_attempts == "1"
        wait_until(lambda: len(log.of("cancelled")) == 3, what="three first attempts cancelled")
        wait_until(lambda: len(RECORDER.outcomes) == len(RECORDER.picks), what="a done() for every pick")
        codes = [o.code for _, o in RECORDER.outcomes]
        assert codes.count(grpc.StatusCode.OK) == 3 and codes.count(grpc.StatusCode.CANCELLED) >= 3
        assert sum(sc.inflight for sc in ch.pickers.snap.ready.values()) == 0


def test_no_backend_fails_like_an_unhedged_call():
    with scripted_servers("a") as (addresses, _log):
        pass  # stopped: its port refuses connections now
    cfg = hedging_config()
    with waypost.dial("direct:///" + addresses[0], service_config=cfg) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Unary(Req(message="ok"), timeout=20)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        stream = stub.ServerStream(Req(message="ok"), timeout=20)
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
