"""The sync balanced channel against real in-process gRPC servers (direct targets)."""

from __future__ import annotations

import json
import time

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.channel.support import (
    RECORDER,
    direct,
    echo_servers,
    recording,  # noqa: F401  # fixture used by pytestmark
)
from waypost.etcd.local import free_port
from waypost.service_config import DEFAULT_POLICY

Req = echo_pb2.EchoRequest
pytestmark = pytest.mark.usefixtures("recording")  # the test_recording policy, for this module only
SERVICE = "waypost.test.Echo"


def test_every_call_kind_through_generated_stub():
    with echo_servers("a", "b") as srv, waypost.dial(direct(srv), balancer="round_robin") as ch:
        assert isinstance(ch, grpc.Channel)
        stub = echo_pb2_grpc.EchoStub(ch)
        names = {"a", "b"}
        assert stub.Unary(Req(message="hi")).message == "hi"
        reply, call = stub.Unary.with_call(Req(message="wc"))
        assert reply.server in names and call.code() == grpc.StatusCode.OK
        fut = stub.Unary.future(Req(message="f"))
        assert fut.result(timeout=10).message == "f" and fut.code() == grpc.StatusCode.OK
        stream = stub.ServerStream(Req(message="s", count=3))
        replies = list(stream)
        assert [r.index for r in replies] == [0, 1, 2] and len({r.server for r in replies}) == 1
        assert stream.code() == grpc.StatusCode.OK
        reply = stub.ClientStream(iter([Req(message=str(i)) for i in range(4)]))
        assert reply.received == 4 and reply.message == "3"
        reply, call = stub.ClientStream.with_call(iter([Req(message="x")] * 2))
        assert reply.received == 2 and call.code() == grpc.StatusCode.OK
        assert stub.ClientStream.future(iter([Req()] * 3)).result(timeout=10).received == 3
        bidi = list(stub.BidiStream(iter([Req(message=str(i)) for i in range(3)])))
        assert [r.message for r in bidi] == ["0", "1", "2"]


def test_seed_experiment_pick_first_vs_round_robin():
    """Two backends: pick_first sends 4/4 calls to one; round_robin alternates."""
    with echo_servers("a", "b") as srv:
        with waypost.dial(direct(srv), balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            got = [stub.Unary(Req()).server for _ in range(4)]
            assert len(got) == 4 and len(set(got)) == 1, got  # whichever connected first, then only it
        with waypost.dial(direct(srv), service_config={"loadBalancingConfig": [{"round_robin": {}}]}) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req()) and False)
            got = [stub.Unary(Req()).server for _ in range(4)]
            assert got[0] != got[1] and got[0::2] == [got[0]] * 2 and got[1::2] == [got[1]] * 2


def test_default_policy_is_prequal_and_config_policy_wins():
    with echo_servers("a") as srv:
        with waypost.dial(direct(srv)) as ch:
            assert ch.balancer.policy.name == "prequal" == DEFAULT_POLICY
            assert echo_pb2_grpc.EchoStub(ch).Unary(Req()).server == "a"
        with waypost.dial(direct(srv), service_config={"loadBalancingPolicy": "round_robin"}) as ch:
            assert ch.balancer.policy.name == "round_robin"


def test_invalid_config_and_target_raise_at_dial():
    with pytest.raises(waypost.InvalidServiceConfig, match="maxAttempts"):
        waypost.dial("direct:///127.0.0.1:1", service_config={"methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 1, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]}}]})
    with pytest.raises(waypost.InvalidServiceConfig, match="no_such_policy|known"):
        waypost.dial("direct:///127.0.0.1:1", balancer="no_such_policy")
    with pytest.raises(waypost.InvalidServiceConfig):
        waypost.dial("direct:///127.0.0.1:1", balancer="round_robin",
                     service_config={"loadBalancingConfig": [{"pick_first": {}}]})
    with pytest.raises(waypost.InvalidServiceConfig):
        waypost.dial("direct:///127.0.0.1:1", service_config="{not json")
    with pytest.raises(waypost.InvalidTarget):
        waypost.dial("direct:///")
    with pytest.raises(waypost.InvalidTarget):
        waypost.dial("etcd:///127.0.0.1:2379")  # no key


def test_outcomes_reported_once_per_call_with_and_without_interceptors():
    class Tagging(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def __init__(self):
            self.seen = 0

        def intercept_unary_unary(self, continuation, details, request):
            self.seen += 1
            return continuation(details, request)

        def intercept_unary_stream(self, continuation, details, request):
            self.seen += 1
            return continuation(details, request)

    with echo_servers("a", "b") as srv:
        for interceptors in ([], [Tagging()]):
            RECORDER.clear()
            with waypost.dial(direct(srv), balancer="test_recording", interceptors=interceptors) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                stub.Unary(Req())
                with pytest.raises(grpc.RpcError) as ei:
                    stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]))
                assert ei.value.code() == grpc.StatusCode.NOT_FOUND
                stub.Unary.future(Req()).result(timeout=10)
                list(stub.ServerStream(Req(count=2)))
                stub.ClientStream(iter([Req()]))
                with pytest.raises(grpc.RpcError):
                    list(stub.BidiStream(iter([Req(error_code=grpc.StatusCode.INTERNAL.value[0])])))
                # stream outcomes arrive from grpc's callback thread: wait for all six
                wait_until(lambda: len(RECORDER.outcomes) == 6, 10)
                codes = [o.code for _, o in RECORDER.outcomes]
                assert sorted(c.name for c in codes) == sorted(
                    ["OK", "NOT_FOUND", "OK", "OK", "OK", "INTERNAL"])
                assert all(o.latency >= 0 for _, o in RECORDER.outcomes)
                assert len(RECORDER.picks) == 6
            if interceptors:
                assert interceptors[0].seen == 4


def test_no_backend_listening_fails_fast_with_states_in_details():
    port = free_port()
    target = f"direct:///127.0.0.1:{port}"
    with waypost.dial(target, balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(), timeout=30)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"127.0.0.1:{port}" in ei.value.details() and target in ei.value.details()
        # Fails on the first refused connection: ~0.04 s measured on an idle machine. 5 s leaves a loaded
        # 2-core machine 100x that, and fails if the call waited for the 30 s deadline or sat through
        # reconnect backoff rounds (1 s, 1.6 s, 2.56 s...) before failing.
        elapsed = time.monotonic() - t0
        assert elapsed < 5, f"failed only after {elapsed:.2f} s, not on the first refused connection"
        # wait_for_ready waits until the deadline instead
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(), timeout=0.3, wait_for_ready=True)
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # ... and succeeds once the backend appears
        fut = stub.Unary.future(Req(), timeout=60, wait_for_ready=True)
        srv = EchoServer("late", port=port).start()
        try:
            assert fut.result(timeout=60).server == "late"
        finally:
            srv.stop(0)


def test_first_call_on_fresh_channel_never_fails():
    with echo_servers("a", "b", "c") as srv:
        for policy in ("round_robin", "p2c_ewma", "pick_first", "least_request", "random"):
            for _ in range(3):
                with waypost.dial(direct(srv), balancer=policy) as ch:
                    assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=30).server in {"a", "b", "c"}


def test_hash_key_sticks_to_one_backend():
    with echo_servers("a", "b", "c", "d") as srv, waypost.dial(direct(srv), balancer="consistent_hash") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 4 or stub.Unary.future(Req()) and False, 30)
        seen = {}
        # 20 keys: the ring depends on the backends' random ports, and 6 keys all fell on one of 4 backends once
        # (about 1 run in 1,000); 20 on one is about 1 in 10^11
        for key in (f"user-{i}" for i in range(20)):
            with waypost.hash_key(key):
                seen[key] = {stub.Unary(Req()).server for _ in range(5)}
        assert all(len(s) == 1 for s in seen.values())
        assert len(set().union(*seen.values())) >= 2
        with pytest.raises(grpc.RpcError) as ei:  # no key: consistent_hash refuses the call
            stub.Unary(Req())
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_not_serving_backend_excluded_unimplemented_is_healthy():
    cfg = {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": SERVICE}}
    with echo_servers("a", "b") as srv:
        nohealth = EchoServer("c", with_health=False).start()
        try:
            for s in srv:
                s.health.set(SERVICE, 1)  # SERVING
            with waypost.dial(direct([*srv, nohealth]), service_config=cfg) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 3, 30, what="3 healthy")
                assert {stub.Unary(Req()).server for _ in range(9)} == {"a", "b", "c"}
                srv[1].health.set(SERVICE, 2)  # NOT_SERVING
                wait_until(lambda: srv[1].address not in ch.balancer.ready_addresses(), 30)
                assert {stub.Unary(Req()).server for _ in range(12)} == {"a", "c"}
                srv[1].health.set(SERVICE, 1)
                wait_until(lambda: srv[1].address in ch.balancer.ready_addresses(), 30)
                assert "b" in {stub.Unary(Req()).server for _ in range(12)}
        finally:
            nohealth.stop(0)


def test_all_not_serving_fails_fast():
    cfg = {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": SERVICE}}
    with echo_servers("a") as srv:
        srv[0].health.set(SERVICE, 2)
        with waypost.dial(direct(srv), service_config=cfg) as ch:
            wait_until(lambda: ch.balancer.subconns()[0].healthy is False, 30)
            with pytest.raises(grpc.RpcError) as ei:
                echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=30)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and "NOT_SERVING" in ei.value.details()


def test_retry_moves_to_another_backend_with_previous_attempts_header():
    cfg = {
        "loadBalancingConfig": [{"test_recording": {}}],
        "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
            "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]}}],
    }
    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    with echo_servers("a", "b", "c") as srv, waypost.dial(direct(srv), service_config=cfg) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req()) and False, 30)
        for _ in range(6):
            RECORDER.clear()
            reply = stub.Unary(Req(error_code=unavailable, fail_on="a,b"))
            assert reply.server == "c"
            tried = [a for a, _ in RECORDER.outcomes]
            assert len(tried) == len(set(tried)), tried  # never the same backend twice
            assert reply.previous_attempts == ("" if len(tried) == 1 else str(len(tried) - 1))
        # non-retryable codes are not retried
        RECORDER.clear()
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(error_code=grpc.StatusCode.NOT_FOUND.value[0]))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and len(RECORDER.outcomes) == 1
        # every backend failing: maxAttempts attempts, then the last error
        RECORDER.clear()
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(error_code=unavailable))
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and len(RECORDER.outcomes) == 3
        # streams: retried before the first message, on another backend
        replies = list(stub.ServerStream(Req(count=2, error_code=unavailable, fail_on="a,b")))
        assert [r.server for r in replies] == ["c", "c"]
        # ... but not after a message was received
        with pytest.raises(grpc.RpcError):
            list(stub.ServerStream(Req(count=3, error_code=unavailable, error_after=1)))
        reply = stub.ClientStream(iter([Req(error_code=unavailable, fail_on="a,b")] * 3))
        assert reply.server == "c" and reply.received == 3
        fut = stub.Unary.future(Req(error_code=unavailable, fail_on="a,b"))
        assert fut.result(timeout=30).server == "c"


def test_retry_throttling_stops_retries():
    cfg = {
        "loadBalancingConfig": [{"test_recording": {}}],
        "methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1,
            "retryableStatusCodes": ["UNAVAILABLE"]}}],
        "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.1},
    }
    with echo_servers("a", "b") as srv, waypost.dial(direct(srv), service_config=cfg) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        RECORDER.clear()
        with pytest.raises(grpc.RpcError):
            stub.Unary(Req(error_code=grpc.StatusCode.UNAVAILABLE.value[0]))
        # 4 tokens: failures take 1 each; retries stop once tokens <= 2 -> 2 attempts, not 5 (a pick discarded
        # while the retry waits for the backend not tried yet is released as CANCELLED: not an attempt)
        attempts = [o for _, o in RECORDER.outcomes if o.code is not grpc.StatusCode.CANCELLED]
        assert len(attempts) == 2


def test_method_timeout_applies_when_caller_gives_none():
    cfg = {"loadBalancingConfig": [{"round_robin": {}}],
           "methodConfig": [{"name": [{"service": SERVICE, "method": "Unary"}], "timeout": "0.2s"}]}
    with echo_servers("a") as srv, waypost.dial(direct(srv), service_config=json.dumps(cfg)) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Unary(Req(delay_ms=3000))
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert stub.Unary(Req(delay_ms=400), timeout=30).server == "a"  # the caller's timeout wins


def test_close_releases_backends_and_subscribe_reports_ready():
    with echo_servers("a", "b") as srv:
        ch = waypost.dial(direct(srv), balancer="round_robin")
        states = []
        ch.subscribe(states.append, try_to_connect=True)
        wait_until(lambda: grpc.ChannelConnectivity.READY in states, 30)
        scs = ch.balancer.subconns()
        assert len(scs) == 2
        ch.unsubscribe(states.append)
        ch.close()
        ch.close()  # idempotent
        assert ch.balancer.subconns() == []
        for sc in scs:  # the backend channels are closed
            with pytest.raises(ValueError):
                sc.channel.unary_unary("/x")(b"")
        with pytest.raises(grpc.RpcError) as ei:
            echo_pb2_grpc.EchoStub(ch).Unary(Req())
        assert ei.value.code() == grpc.StatusCode.CANCELLED


def test_failed_stream_raises_when_iterated_like_grpc():
    with waypost.dial("direct:///127.0.0.1:1", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        stream = stub.ServerStream(Req(count=2), timeout=20)  # no exception yet
        with pytest.raises(grpc.RpcError) as ei:
            next(iter(stream))
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stream.code() == grpc.StatusCode.UNAVAILABLE
