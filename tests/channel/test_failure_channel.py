"""Failure-aware picking (balancer/failure.py) through real channels and real gRPC servers: a backend failing in
1 ms gets few of the calls, with or without retries; a black hole (accepts calls, never answers) loses its calls;
the caller's cancellations and short deadlines leave no failure behind; ``grpc-retry-pushback-ms`` drives retries.
Bounded call counts; assertions on counts and shares only."""

from __future__ import annotations

import threading
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

Req = echo_pb2.EchoRequest
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
SERVICE = "waypost.test.Echo"
POLICIES = ["peak_ewma", "least_request", "prequal"]
CALLERS = 8
CALLS = 320


def config(policy: str, retries: bool = False, codes: tuple[str, ...] = ("UNAVAILABLE",)) -> dict[str, Any]:
    cfg: dict[str, Any] = {"loadBalancingConfig": [{policy: {}}]}
    if retries:
        cfg["methodConfig"] = [{"name": [{"service": SERVICE}], "retryPolicy": {
            "maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
            "retryableStatusCodes": list(codes)}}]
    return cfg


def hammer(stub: Any, request: Any, calls: int = CALLS, timeout: float = 20.0) -> dict[str, int]:
    """``calls`` calls from ``CALLERS`` threads; their status codes counted."""
    codes: dict[str, int] = {}
    lock = threading.Lock()

    def one(_: int) -> None:
        try:
            stub.Unary(request, timeout=timeout)
            name = "OK"
        except grpc.RpcError as e:
            name = e.code().name
        with lock:
            codes[name] = codes.get(name, 0) + 1

    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(one, range(calls)))
    return codes


@contextmanager
def dialed(addresses: list[str], cfg: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    with waypost.dial("direct:///" + ",".join(addresses), service_config=cfg) as ch:
        wait_until(lambda: len(ch.balancer.ready_addresses()) == len(addresses), 30, "every backend READY")
        yield ch, echo_pb2_grpc.EchoStub(ch)


@pytest.mark.parametrize("retries", [False, True], ids=["no-retries", "retries"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_backend_failing_in_1ms_gets_few_calls(policy, retries):
    # good answers in 20 ms; bad fails every call with UNAVAILABLE at once (round robin: half the calls; before
    # failures were a penalty, peak_ewma sent bad most of them)
    with echo_servers("good", delay_ms=20) as (good,), echo_servers("bad") as (bad,), \
            dialed([good.address, bad.address], config(policy, retries)) as (_, stub):
        hammer(stub, Req(), calls=40)  # warm: both answer
        before = bad.servicer.calls
        codes = hammer(stub, Req(error_code=UNAVAILABLE, fail_on="bad"))
        to_bad = bad.servicer.calls - before
    assert to_bad < 0.1 * CALLS, (to_bad, codes)
    if retries:
        assert codes == {"OK": CALLS}, codes


class BlackHoleServicer(EchoServicer):
    """Answers until ``dark`` is set; from then on accepts every call and never answers it (until the caller's
    deadline ends it, or ``released``)."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.dark = threading.Event()
        self.released = threading.Event()
        self.swallowed = 0

    def Unary(self, request: Any, context: Any) -> Any:
        if self.dark.is_set():
            self.swallowed += 1
            while context.is_active() and not self.released.wait(0.05):
                pass
            context.abort(grpc.StatusCode.UNAVAILABLE, "released")
        return super().Unary(request, context)


@contextmanager
def black_hole_server() -> Iterator[tuple[BlackHoleServicer, str]]:
    servicer = BlackHoleServicer("hole", delay_ms=20)
    server = grpc.server(ThreadPoolExecutor(64))
    echo_pb2_grpc.add_EchoServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.released.set()
        server.stop(0).wait(10)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_black_hole_loses_its_calls_long_before_their_deadlines(policy):
    with black_hole_server() as (hole, address), echo_servers("good", delay_ms=20) as (good,), \
            dialed([good.address, address], config(policy)) as (_, stub):
        hammer(stub, Req(), calls=40)
        hole.dark.set()
        codes = hammer(stub, Req(), timeout=5.0)
    # 320 calls from 8 callers: while the hole's calls wait for their 5 s deadline, the good backend answers
    # hundreds; only a few calls go into the hole before its silence outweighs the good backend's load
    assert hole.swallowed <= 2 * CALLERS, (hole.swallowed, codes)
    assert codes.get("OK", 0) == CALLS - hole.swallowed, codes


@pytest.mark.parametrize("policy", POLICIES)
def test_cancellations_and_short_deadlines_leave_no_failure_behind(policy):
    # each backend usually answers in 200 ms; the caller's deadline is 5 ms (its end is measured on a loaded client,
    # late by some milliseconds: far from the backends' usual latency still)
    with echo_servers("a", "b", delay_ms=200) as servers, \
            dialed([s.address for s in servers], config(policy)) as (ch, stub):
        hammer(stub, Req(), calls=40)
        codes = hammer(stub, Req(), calls=80, timeout=0.005)
        futures = [stub.Unary.future(Req()) for _ in range(40)]
        for fut in futures:
            fut.cancel()
        for fut in futures:
            with pytest.raises((grpc.FutureCancelledError, grpc.RpcError)):
                fut.result(timeout=20)
        policy_obj = ch.config.policy
        stats = policy_obj.fallback._stats if policy == "prequal" else policy_obj._stats
        inflight = policy_obj.inflight if policy == "least_request" else lambda: {
            a: st.inflight for a, st in stats.items()}
        wait_until(lambda: set(inflight().values()) == {0}, 20, "every cancelled call ended")
        failed = {addr: st.failures.failed_at for addr, st in stats.items()}
        after = hammer(stub, Req(), calls=160)
        shares = {s.name: s.servicer.calls for s in servers}
    assert set(codes) == {"DEADLINE_EXCEEDED"}, codes
    assert all(t == float("-inf") for t in failed.values()), failed  # no failure recorded on either backend
    assert after == {"OK": 160}
    assert min(shares.values()) > 0.25 * sum(shares.values()), shares
