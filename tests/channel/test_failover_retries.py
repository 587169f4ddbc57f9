"""Failover needs retries: the transparent re-pick of calls that never reached a server, the ``dial(retries=N)``
shortcut, and the service-config trap warnings. Real servers (in-process and as processes killed with SIGKILL),
real sync and aio channels."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many
from harness.waiting import wait_until
from tests.channel.support import direct, echo_servers
from waypost.client.method_names import CHECK_AFTER
from waypost.client.retry import never_sent
from waypost.service_config import parse_service_config

Req = echo_pb2.EchoRequest
U = grpc.StatusCode.UNAVAILABLE
ECHO = "waypost.test.Echo"


# ---- dial(retries=N) ----------------------------------------------------------------------------


def test_retries_shortcut_is_a_retry_policy_on_unavailable_for_every_method():
    sc = parse_service_config(None, retries=2)
    p = sc.method_config("/any.Service/Method").retry_policy
    assert (p.max_attempts, p.initial_backoff, p.max_backoff, p.backoff_multiplier) == (3, 0.05, 1.0, 2.0)
    assert p.retryable_status_codes == {U}
    # kept next to the config's own settings (timeout), for named and unnamed methods alike
    sc = parse_service_config({"methodConfig": [{"name": [{"service": ECHO}], "timeout": "2s"}]}, retries=1)
    assert sc.method_config(f"/{ECHO}/Unary").timeout == 2.0
    assert sc.method_config(f"/{ECHO}/Unary").retry_policy.max_attempts == 2
    assert sc.method_config("/other.S/M").retry_policy.max_attempts == 2
    assert parse_service_config(None, retries=9).method_config("/a.B/C").retry_policy.max_attempts == 5  # gRPC's cap
    assert parse_service_config(None, retries=0).method_config("/a.B/C") is None


def test_retries_shortcut_conflicts_with_a_retry_policy_of_the_config():
    cfg = {"methodConfig": [{"name": [{"service": ECHO}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    with pytest.raises(waypost.InvalidServiceConfig, match=r"^retries: .*methodConfig\[0\] has its own retryPolicy"):
        waypost.dial("direct:///127.0.0.1:1", service_config=cfg, retries=2)
    with pytest.raises(waypost.InvalidServiceConfig, match="^retries: expected an integer >= 0"):
        waypost.aio.dial("direct:///127.0.0.1:1", retries=True)
    with pytest.raises(waypost.InvalidServiceConfig, match="^retries: expected an integer >= 0"):
        waypost.dial("direct:///127.0.0.1:1", retries=-1)


def test_retries_shortcut_moves_calls_off_a_stopped_backend_sync_and_aio():
    with echo_servers("dead", "alive") as (dead, alive):
        with waypost.dial(direct([dead, alive]), balancer="round_robin", retries=2) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req(), timeout=20) and False, 30)
            assert ch.config.method_config(f"/{ECHO}/Unary").retry_policy.max_attempts == 3
            dead.stop(0)
            # every kind, before the stale picker is replaced too
            assert {stub.Unary(Req(), timeout=20).server for _ in range(10)} == {"alive"}
            assert [r.server for r in stub.ServerStream(Req(count=2), timeout=20)] == ["alive", "alive"]

        async def aio() -> set[str]:
            async with waypost.aio.dial(direct([dead, alive]), balancer="round_robin", retries=2) as ach:
                s = echo_pb2_grpc.EchoStub(ach)
                return {(await s.Unary(Req(), timeout=20)).server for _ in range(10)}

        assert asyncio.run(asyncio.wait_for(aio(), 60)) == {"alive"}


# ---- SIGKILL with calls flowing ----------------------------------------------------------------


class _Load:
    """``threads`` callers in a loop for ``seconds`` (20 ms calls); records successes and failures."""

    def __init__(self, stub, threads: int, seconds: float) -> None:
        self.stub, self.ok, self.failed = stub, 0, []
        self._lock = threading.Lock()
        self._stop = time.monotonic() + seconds
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        while time.monotonic() < self._stop:
            try:
                self.stub.Unary(Req(delay_ms=20), timeout=20)
            except grpc.RpcError as e:
                with self._lock:
                    self.failed.append((e.code(), e.details()))
            else:
                with self._lock:
                    self.ok += 1

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self._threads:
            t.join(60)


@pytest.fixture
def procs():
    ps = spawn_many(["k0", "k1", "k2"])
    try:
        yield ps
    finally:
        for p in ps:
            p.close()


@pytest.mark.parametrize("retries", [None, 2])
def test_sigkill_sync_without_policy_fails_only_calls_in_flight_and_with_retries_none(procs, retries):
    with waypost.dial(direct(procs), balancer="round_robin", retries=retries) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req(), timeout=20) and False, 30)
        with _Load(stub, threads=4, seconds=2.0) as load:
            wait_until(lambda: load.ok > 20, 20)
            procs[1].kill()
        assert load.ok > 50
        if retries:
            assert load.failed == []
            return
        # only calls already on the killed backend may fail (one per thread at most); none of the failures is
        # one that never reached a server (those were re-picked)
        assert len(load.failed) <= 4, load.failed
        assert all(code == U and not never_sent(code, d) for code, d in load.failed), load.failed


@pytest.mark.parametrize("retries", [None, 2])
def test_sigkill_aio_without_policy_fails_only_calls_in_flight_and_with_retries_none(procs, retries):
    async def main() -> tuple[int, list]:
        ok, failed = 0, []
        async with waypost.aio.dial(direct(procs), balancer="round_robin", retries=retries) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            for _ in range(30):
                await stub.Unary(Req(), timeout=20)
            t_end = time.monotonic() + 2.0

            async def worker() -> None:
                nonlocal ok
                while time.monotonic() < t_end:
                    try:
                        await stub.Unary(Req(delay_ms=20), timeout=20)
                    except grpc.aio.AioRpcError as e:
                        failed.append((e.code(), e.details()))
                    else:
                        ok += 1

            tasks = [asyncio.ensure_future(worker()) for _ in range(4)]
            while ok < 20:
                await asyncio.sleep(0.01)
            await asyncio.get_running_loop().run_in_executor(None, procs[2].kill)
            await asyncio.gather(*tasks)
        return ok, failed

    ok, failed = asyncio.run(asyncio.wait_for(main(), 90))
    assert ok > 50
    if retries:
        assert failed == []
    else:
        assert len(failed) <= 4, failed
        assert all(code == U and not never_sent(code, d) for code, d in failed), failed


# ---- service-config traps -----------------------------------------------------------------------


def test_retry_policy_without_unavailable_warns_at_parse():
    cfg = {"methodConfig": [{"name": [{}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["DATA_LOSS", "RESOURCE_EXHAUSTED"]}}]}
    with pytest.warns(waypost.ConfigWarning) as got:
        parse_service_config(cfg)
    lines = [str(w.message) for w in got if issubclass(w.category, waypost.ConfigWarning)]
    assert lines == [("waypost: service config: methodConfig[0].retryPolicy.retryableStatusCodes: [DATA_LOSS, "
                     "RESOURCE_EXHAUSTED] lacks UNAVAILABLE: retries will not move a call off a dead backend "
                     "(a backend that is down or restarting fails calls with UNAVAILABLE)")]
    assert got[0].filename == __file__  # attributed to the caller, not to waypost's parser


def _name_warnings(got) -> list[str]:
    return [str(w.message) for w in got if issubclass(w.category, waypost.ConfigWarning) and "matches" in str(w.message)]


def test_method_config_name_without_package_warns_once_with_did_you_mean_sync():
    cfg = {"methodConfig": [{"name": [{"service": "Echo"}], "timeout": "5s"},
                            {"name": [{"service": ECHO, "method": "unary"}], "timeout": "5s"}]}
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")  # every warning given, so "once per channel" is waypost's own doing
        with echo_servers("s") as servers, waypost.dial(direct(servers), service_config=cfg) as ch:
            for _ in range(3):  # stubs built again and again, calls made: still one warning per name
                stub = echo_pb2_grpc.EchoStub(ch)
                assert stub.Unary(Req(), timeout=20).server == "s"
    lines = _name_warnings(got)
    assert sorted(lines) == sorted([
        (f"waypost: direct:///{servers[0].address}: service config methodConfig[0].name[0] 'Echo' matches no "
        f"method called on this channel; did you mean '{ECHO}'?"),
        (f"waypost: direct:///{servers[0].address}: service config methodConfig[1].name[0] '{ECHO}/unary' matches "
        f"no method called on this channel; did you mean '{ECHO}/Unary'?"),
    ]), lines


def test_method_config_name_matching_nothing_warns_after_the_first_methods_aio():
    cfg = {"methodConfig": [{"name": [{"service": "nope.Svc"}], "timeout": "5s"},
                            {"name": [{"service": ECHO}], "timeout": "5s"}]}
    seen: list[list[str]] = []

    async def main() -> None:
        async with waypost.aio.dial("direct:///127.0.0.1:1", service_config=cfg) as ch:
            echo_pb2_grpc.EchoStub(ch)
            seen.append(_name_warnings(got))  # too early to say
            for i in range(CHECK_AFTER + 5):
                ch.unary_unary(f"/other.Svc/M{i}")
            echo_pb2_grpc.EchoStub(ch)

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        asyncio.run(asyncio.wait_for(main(), 30))
    assert seen == [[]]
    assert _name_warnings(got) == [
        (f"waypost: direct:///127.0.0.1:1: service config methodConfig[0].name[0] 'nope.Svc' matches none of the "
        f"{CHECK_AFTER} methods called on this channel so far (names are 'package.Service' and 'Method', as in "
        "the .proto)")]


def test_calls_that_never_reached_a_server_are_re_picked_without_any_retry_policy():
    """The stale-picker window right after a backend stops (before the poller demotes it): attempts picked on it
    fail "failed to connect" (nothing was sent) and are re-picked on the other backend, for server-streaming
    and unary calls, sync and aio. (Whether a call lands in that window is up to timing; every call must pass.)"""
    with echo_servers("dead", "alive") as (dead, alive), \
            waypost.dial(direct([dead, alive]), balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req(), timeout=20) and False, 30)
        dead.stop(0)
        assert all([r.server for r in stub.ServerStream(Req(count=1), timeout=20)] == ["alive"] for _ in range(6))
        assert {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"alive"}

    with echo_servers("dead", "alive") as (dead, alive):
        async def aio() -> set[str]:
            async with waypost.aio.dial(direct([dead, alive]), balancer="round_robin") as ach:
                s = echo_pb2_grpc.EchoStub(ach)
                for _ in range(100):
                    if len(ach.balancer.ready_addresses()) == 2:
                        break
                    await s.Unary(Req(), timeout=20)
                    await asyncio.sleep(0.05)
                dead.stop(0)
                got = {(await s.Unary(Req(), timeout=20)).server for _ in range(6)}
                for _ in range(6):
                    got |= {r.server async for r in s.ServerStream(Req(count=1), timeout=20)}
                return got

        assert asyncio.run(asyncio.wait_for(aio(), 60)) == {"alive"}
