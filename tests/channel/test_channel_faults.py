"""Backends dying under load: real server subprocesses, SIGKILL and SIGSTOP."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import EchoProcess, spawn_many
from harness.waiting import wait_until
from tests.channel.support import direct
from waypost.client.channel_args import merge_options

Req = echo_pb2.EchoRequest

RETRY = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}


class Load:
    """``threads`` callers in a loop for ``seconds``; records (time, server) of successes and the failures."""

    def __init__(self, stub, threads: int = 4, seconds: float = 2.0, delay_ms: int = 3) -> None:
        self.stub = stub
        self.ok: list[tuple[float, str]] = []
        self.failed: list[tuple[float, grpc.StatusCode, str]] = []
        self.inflight = 0
        self._lock = threading.Lock()
        self._stop = time.monotonic() + seconds
        self._threads = [threading.Thread(target=self._run, args=(delay_ms,)) for _ in range(threads)]

    def _run(self, delay_ms: int) -> None:
        while time.monotonic() < self._stop:
            try:
                r = self.stub.Unary(Req(delay_ms=delay_ms), timeout=20)
            except grpc.RpcError as e:
                with self._lock:
                    self.failed.append((time.monotonic(), e.code(), e.details()))
            else:
                with self._lock:
                    self.ok.append((time.monotonic(), r.server))

    def __enter__(self) -> Load:  # noqa: PYI034
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self._threads:
            t.join(60)

    def servers_after(self, t: float) -> set[str]:
        with self._lock:
            return {s for ts, s in self.ok if ts > t}


@pytest.fixture
def procs():
    ps = spawn_many(["p0", "p1", "p2"])
    try:
        yield ps
    finally:
        for p in ps:
            p.close()


def test_sigkill_under_load_with_retry_policy_loses_nothing(procs):
    with waypost.dial(direct(procs), service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req()) and False, 30)
        with Load(stub, threads=4, seconds=2.0) as load:
            wait_until(lambda: len(load.ok) > 50, 20)
            victim = procs[0]
            victim.kill()
            t_kill = time.monotonic()
            gone = wait_until(lambda: victim.address not in ch.balancer.ready_addresses() and time.monotonic(),
                              10, what="killed backend demoted")
        assert load.failed == []
        assert len(load.ok) > 100
        # demoted promptly after its connection dropped (loose bound: loaded CI machines)
        assert gone - t_kill < 2.0
        late = [s for ts, s in load.ok if ts > gone + 0.05]
        assert "p0" not in late and {"p1", "p2"} <= set(late)


def test_sigkill_without_retry_policy_fails_at_most_the_calls_in_flight(procs):
    with waypost.dial(direct(procs), balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req()) and False, 30)
        with Load(stub, threads=4, seconds=2.0, delay_ms=20) as load:
            wait_until(lambda: len(load.ok) > 20, 20)
            procs[1].kill()
        # at most one call per thread was on the killed backend when it died
        assert len(load.failed) <= 4, load.failed
        assert all(code == grpc.StatusCode.UNAVAILABLE for _, code, _ in load.failed)
        assert len(load.ok) > 50


def test_killed_backend_picked_again_after_restart():
    p = EchoProcess("first")
    other = EchoProcess("other")
    try:
        with waypost.dial(direct([p, other]), balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req()) and False, 30)
            port = p.port
            p.kill()
            wait_until(lambda: p.address not in ch.balancer.ready_addresses(), 10)
            assert {stub.Unary(Req()).server for _ in range(6)} == {"other"}
            p2 = EchoProcess("second", port=port)
            try:
                # gRPC reconnect backoff (1 s initial, jittered, growing) bounds how soon it is back
                wait_until(lambda: p2.address in ch.balancer.ready_addresses(), 60, what="reconnected")
                assert "second" in {stub.Unary(Req()).server for _ in range(6)}
            finally:
                p2.close()
    finally:
        p.close()
        other.close()


def test_sigstopped_backend_loses_its_traffic(procs):
    with waypost.dial(direct(procs), service_config=RETRY) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req()) and False, 30)
        victim = procs[2]
        try:
            with Load(stub, threads=4, seconds=3.5) as load:
                wait_until(lambda: len(load.ok) > 50, 20)
                victim.pause()
                t_stop = time.monotonic()
                gone = wait_until(lambda: victim.address not in ch.balancer.ready_addresses() and time.monotonic(),
                                  15, what="hung backend demoted")
            # keepalive 1 s + ping timeout 1 s: ~2 s; the bound is loose for loaded machines
            assert gone - t_stop < 4.0, gone - t_stop
            assert "p2" not in load.servers_after(gone + 0.05)
            assert load.failed == []
        finally:
            victim.resume()


def test_a_call_queued_on_a_backend_channel_to_a_hung_server_fails_retryably_before_its_deadline():
    """The window the test above can hit under load: a call picked while its backend's connection was dying waits
    inside that backend channel while it reconnects to the hung server (TCP connects, HTTP/2 never answers). With
    grpc's default 20 s connect timeout it waited until its deadline (DEADLINE_EXCEEDED, never retried); our
    backend channels' options make it fail UNAVAILABLE (retryable, on another backend) after ~5 s."""
    p = EchoProcess("hung")
    try:
        p.pause()
        with grpc.insecure_channel(p.address, options=merge_options(None)) as ch:
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as ei:
                echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=30)
            elapsed = time.monotonic() - t0
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        assert elapsed < 20, elapsed  # the connect timeout (5 s), far below the call's 30 s deadline
    finally:
        p.resume()
        p.close()


def test_long_quiet_call_is_not_killed_by_keepalive_pings():
    """Our keepalive (hung-backend detection) must not trip servers' ping policing ("too_many_pings")
    on calls that send no data for several seconds (grpcio default server settings)."""
    p = EchoProcess("quiet")
    try:
        with waypost.dial(direct([p]), balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            quiet = stub.Unary.future(Req(delay_ms=9000), timeout=60)
            assert [r.index for r in stub.ServerStream(Req(count=2, delay_ms=4000), timeout=60)] == [0, 1]
            assert quiet.result(timeout=60).server == "quiet"
    finally:
        p.close()
