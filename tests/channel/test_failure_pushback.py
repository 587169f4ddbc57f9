"""``grpc-retry-pushback-ms`` (gRFC A6): retries take it as their delay (a negative or malformed value stops them),
and the load-aware pickers avoid the backend that sent it for that long. RetryState on its own, then real servers
whose failed calls carry the trailer."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from waypost.balancer.failure import PUSHBACK_STOP
from waypost.client.retry import RetryState
from waypost.service_config import parse_service_config

Req = echo_pb2.EchoRequest
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
SERVICE = "waypost.test.Echo"
RETRY = {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
         "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}


def config(policy: str) -> dict[str, Any]:
    return {"loadBalancingConfig": [{policy: {}}],
            "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": RETRY}]}


def retry_state(deadline: float | None = None) -> RetryState:
    policy = parse_service_config(config("round_robin")).method_configs[0].retry_policy
    return RetryState(policy, None, random.Random(1), deadline)


def test_a_pushback_replaces_the_backoff_and_a_negative_one_stops_the_retries():
    st = retry_state()
    assert st.after_failure(EXHAUSTED, "busy", 0.3) == 0.3  # not the 10 ms backoff
    assert st.after_failure(EXHAUSTED, "busy", 0.0) == 0.0
    assert st.after_failure(EXHAUSTED, "busy", PUSHBACK_STOP) is None  # the server says: do not retry
    assert retry_state().after_failure(grpc.StatusCode.INTERNAL, "x", 0.1) is None  # not a retryable code
    assert retry_state(deadline=time.monotonic() + 5).after_failure(EXHAUSTED, "x", 60.0) is None  # past the deadline


class PushbackServicer(EchoServicer):
    """Fails every call with RESOURCE_EXHAUSTED and ``grpc-retry-pushback-ms: value``."""

    def __init__(self, name: str, value: str) -> None:
        super().__init__(name)
        self.value = value
        self.lock = threading.Lock()

    def Unary(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.calls += 1
        context.set_trailing_metadata([("grpc-retry-pushback-ms", self.value)])
        context.abort(EXHAUSTED, "come back later")


@contextmanager
def pushback_server(value: str) -> Iterator[tuple[PushbackServicer, str]]:
    servicer = PushbackServicer("pushy", value)
    server = grpc.server(ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(10)


@pytest.mark.parametrize(("value", "attempts"), [("-1", 1), ("soon", 1), ("0", 4)])
def test_retries_follow_the_server_s_pushback(value, attempts):
    with pushback_server(value) as (servicer, address), \
            waypost.dial(f"direct:///{address}", service_config=config("round_robin")) as ch, \
            pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20, wait_for_ready=True)
    assert err.value.code() is EXHAUSTED
    assert servicer.calls == attempts


@pytest.mark.parametrize("policy", ["peak_ewma", "least_request", "prequal"])
def test_the_picker_avoids_a_backend_for_as_long_as_it_pushed_back(policy):
    # pushy fails every call with a one-minute pushback, the other answers: after pushy's first answer no call
    # goes there (no retry policy: a call that went there fails, so the count is plain)
    with pushback_server("60000") as (servicer, address), echo_servers("fine") as (fine,), \
            waypost.dial(f"direct:///{address},{fine.address}",
                         service_config={"loadBalancingConfig": [{policy: {}}]}) as ch:
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 30, "both backends READY")
        stub = echo_pb2_grpc.EchoStub(ch)
        served = []
        for _ in range(100):
            try:
                served.append(stub.Unary(Req(), timeout=20).server)
            except grpc.RpcError as e:
                assert e.code() is EXHAUSTED
                served.append("pushy")
    assert servicer.calls <= 1
    assert served.count("fine") >= 99
