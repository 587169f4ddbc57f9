"""prequal on real gRPC servers: probes through the channel's own backend channels (sync and aio), a slowed
backend avoided, plain servers (no load reports) still served."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer, EchoServicer
from harness.waiting import wait_until
from waypost.server import serve

SLOW_MS = 40
CALLS = 120


@contextlib.contextmanager
def fleet(key: str, delays: list[int]) -> Iterator[list[str]]:
    """Servers started with ``serve()`` (memory registry), named s0, s1...; their addresses."""
    with contextlib.ExitStack() as stack:
        addrs = []
        for i, delay in enumerate(delays):
            server = grpc.server(futures.ThreadPoolExecutor(16))
            echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(f"s{i}", delay), server)
            h = stack.enter_context(serve(server, key, listen_on="127.0.0.1:0", registry=f"memory://{key}",
                                          grace=0))
            addrs.append(h.address)
        yield addrs


def target(addrs: list[str]) -> str:
    return "direct:///" + ",".join(addrs)


REQ = echo_pb2.EchoRequest(message="x")


def test_sync_channel_steers_away_from_the_slow_backend(unique_key):
    with fleet(unique_key, [0, 0, SLOW_MS]) as addrs, waypost.dial(target(addrs), balancer="prequal") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        policy = ch.config.policy
        # warm up until every backend has answered a probe with a latency estimate
        wait_until(lambda: stub.Unary(REQ, timeout=10) and len({p.address for p in policy.pool()}) == 3
                   and all(s.latency for s in policy.signals() if s.probe_age is not None),
                   what="probes of all three backends")
        seen = Counter(stub.Unary(REQ, timeout=10).server for _ in range(CALLS))
        assert policy.probes_sent > 0 and policy.probe_picks > 0
        # round robin would send a third (40) there; the probes say it is 40x slower
        assert seen["s2"] < CALLS // 6, seen
        signals = {s.address: s for s in policy.signals()}
        assert signals[addrs[2]].latency > signals[addrs[0]].latency


def test_aio_channel_steers_away_from_the_slow_backend(unique_key):
    async def run(addrs: list[str]) -> tuple[Counter[str], object]:
        async with waypost.aio.dial(target(addrs), balancer="prequal") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            policy = ch.config.policy
            for _ in range(200):  # bounded warm-up: until every backend answered a probe
                await stub.Unary(REQ, timeout=10)
                if len({p.address for p in policy.pool()}) == 3:
                    break
                await asyncio.sleep(0.01)
            seen: Counter[str] = Counter()
            for _ in range(CALLS):
                seen[(await stub.Unary(REQ, timeout=10)).server] += 1
            return seen, policy

    with fleet(unique_key, [0, 0, SLOW_MS]) as addrs:
        seen, policy = asyncio.run(run(addrs))
    assert policy.probes_sent > 0 and policy.probe_picks > 0
    assert seen["s2"] < CALLS // 6, seen


@pytest.mark.parametrize("aio", [False, True])
def test_plain_servers_without_reports_still_work(aio):
    """Servers without the load-report service: every call served, both backends known to have no reports, and
    calls spread over both (batches of concurrent calls: this client's own calls in flight make one hot)."""
    servers = [EchoServer(f"p{i}", with_health=False).start() for i in range(2)]
    addrs = [s.address for s in servers]
    slow = echo_pb2.EchoRequest(message="x", delay_ms=20)
    try:
        if aio:
            async def run() -> tuple[Counter[str], object]:
                async with waypost.aio.dial(target(addrs), balancer="prequal") as ch:
                    stub = echo_pb2_grpc.EchoStub(ch)
                    seen: Counter[str] = Counter()
                    for _ in range(15):
                        replies = await asyncio.gather(*(stub.Unary(slow, timeout=10) for _ in range(4)))
                        seen.update(r.server for r in replies)
                    for _ in range(100):  # the UNIMPLEMENTED answers arrive asynchronously
                        if ch.config.policy.without_reports() == set(addrs):
                            break
                        await stub.Unary(REQ, timeout=10)
                        await asyncio.sleep(0.01)
                    return seen, ch.config.policy

            seen, policy = asyncio.run(run())
        else:
            with waypost.dial(target(addrs), balancer="prequal") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                seen = Counter()
                for _ in range(15):
                    batch = [stub.Unary.future(slow, timeout=10) for _ in range(4)]
                    seen.update(f.result().server for f in batch)
                policy = ch.config.policy
                wait_until(lambda: stub.Unary(REQ, timeout=10) and policy.without_reports() == set(addrs),
                           what="both plain servers known to have no load reports")
        assert sum(seen.values()) == 60 and set(seen) == {"p0", "p1"}, seen
        assert policy.without_reports() == set(addrs)
    finally:
        for s in servers:
            s.server.stop(0)


def test_probes_to_a_stopped_backend_stop(unique_key):
    with fleet(unique_key, [0, 0]) as addrs, contextlib.ExitStack() as stack:
        spare = grpc.server(futures.ThreadPoolExecutor(4))
        echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("gone"), spare)
        h = serve(spare, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0)
        ch = stack.enter_context(waypost.dial(target([*addrs, h.address]), balancer="prequal"))
        stub = echo_pb2_grpc.EchoStub(ch)
        policy = ch.config.policy
        wait_until(lambda: stub.Unary(REQ, timeout=10) and h.address in {p.address for p in policy.pool()},
                   what="a probe of the third backend")
        h.stop()
        wait_until(lambda: h.address not in ch.balancer.ready_addresses(), what="the stopped backend not READY")
        sent = policy.probes_sent
        # probing goes on for the live backends (probes are rate-limited: calls until one is sent, bounded)...
        wait_until(lambda: stub.Unary(REQ, timeout=10) and policy.probes_sent > sent, 10,
                   what="a probe of a live backend after the stop")
        assert h.address not in {p.address for p in policy.pool()}  # ...its probe left with it...
        assert ch.balancer._prober.probe(h.address) is False  # ...and the prober refuses to send one


def _no_probes() -> dict:
    return {"loadBalancingConfig": [{"prequal": {"probesPerPick": 0}}]}


def test_sync_calls_carry_the_servers_load_without_probes(unique_key):
    # no probe at all: the pool fills from the calls' own trailers (waypost-server-load) and steers by them
    with fleet(unique_key, [0, 0, SLOW_MS]) as addrs, \
            waypost.dial(target(addrs), service_config=_no_probes()) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        policy = ch.config.policy
        wait_until(lambda: stub.Unary(REQ, timeout=10) and len({p.address for p in policy.pool()}) >= 2,
                   what="call reports of two backends")
        seen = Counter(stub.Unary(REQ, timeout=10).server for _ in range(CALLS))
        assert policy.probes_sent == 0 and policy.probe_picks > 0
        assert seen["s2"] < CALLS // 6, seen


def test_aio_calls_carry_the_servers_load_without_probes(unique_key):
    async def run(addrs: list[str]) -> object:
        async with waypost.aio.dial(target(addrs), service_config=_no_probes()) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            policy = ch.config.policy
            for _ in range(CALLS):
                await stub.Unary(REQ, timeout=10)
            return policy

    with fleet(unique_key, [0, 0]) as addrs:
        policy = asyncio.run(run(addrs))
    assert policy.probes_sent == 0 and policy.probe_picks > 0  # type: ignore[attr-defined]
    assert {p.address for p in policy.pool()} <= set(addrs) and policy.pool()  # type: ignore[attr-defined]
