"""weighted_round_robin (gRPC A58) over ORCA reports: the weight rules on a fake clock, the config, the renamed
smooth_weighted_round_robin, and end to end over real waypost servers (per call and out of band) and over real
grpcio servers that report badly or never."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
import warnings
from concurrent import futures

import grpc
import pytest

import waypost
import waypost.aio
from harness.waiting import wait_until
from waypost import orca
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.balancer.weighted_round_robin import OrcaWeightedRoundRobinPolicy, StaticStrideScheduler
from waypost.errors import InvalidServiceConfig
from waypost.orca import _protos
from waypost.types import Backend

ADDRS = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
INFO = PickInfo("/s/M")


def report_bytes(**fields: float) -> bytes:
    msg = _protos.protos()[0].OrcaLoadReport()  # type: ignore[index]
    for k, v in fields.items():
        setattr(msg, k, v)
    return msg.SerializeToString()  # type: ignore[no-any-return]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(config: dict | None = None) -> tuple[OrcaWeightedRoundRobinPolicy, Clock]:
    clock = Clock()
    cfg = OrcaWeightedRoundRobinPolicy.parse_config(config or {}, "lb")
    return OrcaWeightedRoundRobinPolicy(cfg, clock=clock, rng=random.Random(1)), clock


def split(picker, n: int = 600, trailer: bytes | None = None) -> list[int]:  # type: ignore[no-untyped-def]
    counts = collections.Counter()
    for _ in range(n):
        res = picker.pick(INFO)
        counts[res.backend.address] += 1
        md = None if trailer is None else ((orca.MIRROR_KEY, trailer),)
        res.done(Outcome(grpc.StatusCode.OK, 0.001, md))
    return [counts[a] for a in ADDRS]


def feed(policy: OrcaWeightedRoundRobinPolicy, utils: list[float], key: str = "cpu_utilization",
         qps: float = 100.0, eps: float = 0.0) -> None:
    for a, u in zip(ADDRS, utils):
        policy.on_load_report(a, orca.parse_report(report_bytes(**{key: u, "rps_fractional": qps, "eps": eps})))  # type: ignore[arg-type]


def test_a58_weights_after_the_blackout_and_until_expiry():
    policy, clock = make({"blackoutPeriod": "10s", "weightExpirationPeriod": "180s", "weightUpdatePeriod": "1s"})
    picker = policy.build([Backend(a) for a in ADDRS])
    feed(policy, [0.9, 0.3, 0.1])
    assert split(picker) == [200, 200, 200]  # blackout: no weight counts yet
    clock.t += 10
    feed(policy, [0.9, 0.3, 0.1])
    got = split(picker)  # A58: qps / utilization = 111 : 333 : 1000
    assert all(abs(g - e) <= 2 for g, e in zip(got, [46, 138, 415])), got
    assert policy.weights() == pytest.approx({ADDRS[0]: 100 / 0.9, ADDRS[1]: 100 / 0.3, ADDRS[2]: 1000.0})
    feed(policy, [0.1, 0.3, 0.9])
    again = split(picker)  # the picker's weights change only at its next update (weightUpdatePeriod)...
    assert all(abs(g - e) <= 2 for g, e in zip(again, [46, 138, 415])), again
    clock.t += 1
    got = split(picker)  # ...then follow the new reports
    assert all(abs(g - e) <= 2 for g, e in zip(got, [415, 138, 46])), got
    clock.t += 180  # no report for weightExpirationPeriod: back to equal weights
    assert split(picker) == [200, 200, 200]
    feed(policy, [0.9, 0.3, 0.1])
    clock.t += 2
    assert split(picker) == [200, 200, 200]  # an expired weight goes through the blackout again


def test_application_utilization_wins_and_errors_are_penalised():
    policy, clock = make({"blackoutPeriod": "0s", "errorUtilizationPenalty": 2.0})
    picker = policy.build([Backend(a) for a in ADDRS])
    for a, (app, cpu) in zip(ADDRS, [(0.1, 0.9), (0.3, 0.3), (0.9, 0.1)]):
        policy.on_load_report(a, orca.LoadReport(cpu_utilization=cpu, application_utilization=app,
                                                  rps_fractional=100))
    clock.t += 1
    got = split(picker)
    assert all(abs(g - e) <= 2 for g, e in zip(got, [415, 138, 46])), got
    policy.on_load_report(ADDRS[0], orca.LoadReport(cpu_utilization=0.5, rps_fractional=100, eps=10))
    assert policy.weights()[ADDRS[0]] == pytest.approx(100 / (0.5 + 10 / 100 * 2.0))


def test_a_backend_without_weight_gets_the_mean_and_zero_reports_are_ignored():
    policy, clock = make({"blackoutPeriod": "0s"})
    picker = policy.build([Backend(a) for a in ADDRS])
    policy.on_load_report(ADDRS[0], orca.LoadReport(cpu_utilization=0.5, rps_fractional=100))  # 200
    policy.on_load_report(ADDRS[1], orca.LoadReport(cpu_utilization=0.25, rps_fractional=100))  # 400
    policy.on_load_report(ADDRS[2], orca.LoadReport(cpu_utilization=0.0, rps_fractional=100))  # no utilization
    policy.on_load_report(ADDRS[2], orca.LoadReport(cpu_utilization=0.5, rps_fractional=0.0))  # no qps
    clock.t += 1
    got = split(picker, 900)  # 200 : 400 : mean 300
    assert all(abs(g - e) <= 2 for g, e in zip(got, [200, 400, 300])), got


def test_per_call_reports_come_through_done_and_oob_turns_them_off():
    policy, _ = make({"blackoutPeriod": "0s"})
    backends = [Backend(a) for a in ADDRS]
    picker = policy.build(backends)
    res = picker.pick(INFO)
    assert res.wants_trailers
    res.done(Outcome(grpc.StatusCode.OK, 0.01, ((orca.MIRROR_KEY, report_bytes(cpu_utilization=0.5,
                                                                                 rps_fractional=10)),)))
    assert policy.weights()[res.backend.address] == 20.0
    oob, _ = make({"enableOobLoadReport": True})
    assert oob.wants_load_reports and not oob.build(backends).pick(INFO).wants_trailers


@pytest.mark.parametrize("bad", [b"\xff\xff\xff", report_bytes(cpu_utilization=float("nan"), rps_fractional=1),
                                 report_bytes(cpu_utilization=-0.5, rps_fractional=1),
                                 report_bytes(mem_utilization=1.5, cpu_utilization=0.5, rps_fractional=1),
                                 report_bytes(cpu_utilization=0.5, rps_fractional=float("inf"))])
def test_bad_reports_are_logged_once_and_ignored(bad, caplog):
    policy, clock = make({"blackoutPeriod": "0s"})
    picker = policy.build([Backend(a) for a in ADDRS])
    caplog.set_level(logging.WARNING, logger="waypost.balancer.weighted_round_robin")
    assert split(picker, 600, bad) == [200, 200, 200]
    clock.t += 2
    assert split(picker, 600, bad) == [200, 200, 200]
    assert policy.weights() == {a: 0.0 for a in ADDRS}
    logged = [r for r in caplog.records if "ignoring a load report" in r.message]
    assert len(logged) == 3  # once per backend, not once per call
    # ORCA allows a CPU utilization above 1: used, not refused
    policy.on_load_report(ADDRS[0], orca.parse_report(report_bytes(cpu_utilization=1.5, rps_fractional=3)))  # type: ignore[arg-type]
    assert policy.weights()[ADDRS[0]] == 2.0


def test_config_uses_grpc_names_and_checks_them():
    cfg = OrcaWeightedRoundRobinPolicy.parse_config({
        "enableOobLoadReport": True, "oobReportingPeriod": "0.5s", "blackoutPeriod": "2s",
        "weightExpirationPeriod": "60s", "weightUpdatePeriod": "0.01s", "errorUtilizationPenalty": 0}, "lb")
    p = OrcaWeightedRoundRobinPolicy(cfg)
    assert (p.oob, p.oob_period, p.blackout, p.expiration, p.update_period, p.penalty) == (
        True, 0.5, 2.0, 60.0, 0.1, 0.0)  # weightUpdatePeriod is at least 100 ms
    d = OrcaWeightedRoundRobinPolicy({})
    assert (d.oob, d.oob_period, d.blackout, d.expiration, d.update_period, d.penalty) == (
        False, 10.0, 10.0, 180.0, 1.0, 1.0)
    with pytest.raises(InvalidServiceConfig, match="lb.weight: unknown field for weighted_round_robin"):
        OrcaWeightedRoundRobinPolicy.parse_config({"weight": 1}, "lb")
    with pytest.raises(InvalidServiceConfig, match="errorUtilizationPenalty"):
        OrcaWeightedRoundRobinPolicy.parse_config({"errorUtilizationPenalty": -1}, "lb")


def test_static_stride_scheduler_is_exact_over_a_cycle():
    s = StaticStrideScheduler([1.0, 2.0, 0.0], start=0)  # 0: the mean, 1.5
    counts = collections.Counter(s.pick() for _ in range(4500))
    assert [counts[i] for i in range(3)] == pytest.approx([1000, 2000, 1500], abs=3)
    assert StaticStrideScheduler([0.0, 0.0], start=5).round_robin


def test_weighted_round_robin_is_grpcs_policy_everywhere():
    assert get_policy("weighted_round_robin") is OrcaWeightedRoundRobinPolicy
    assert get_policy("smooth_weighted_round_robin").name == "smooth_weighted_round_robin"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with waypost.dial("direct:///127.0.0.1:1", balancer="weighted_round_robin") as ch:
            assert ch.balancer.policy.name == "weighted_round_robin"  # the shorthand names the same policy
        sc = {"loadBalancingConfig": [{"weighted_round_robin": {}}]}
        with waypost.dial("direct:///127.0.0.1:1", service_config=sc) as ch:
            assert ch.balancer.policy.name == "weighted_round_robin"  # a service config means gRPC's policy
        with waypost.dial("direct:///127.0.0.1:1", service_config=sc, balancer="weighted_round_robin") as ch:
            assert ch.balancer.policy.name == "weighted_round_robin"


# ---- end to end ---------------------------------------------------------------------------------------------

CONFIG = {"blackoutPeriod": "0.3s", "weightUpdatePeriod": "0.1s"}


def start_servers(utils, build=None):  # type: ignore[no-untyped-def]
    """Three waypost servers (sync), each replying with its index; ``build(i, server)`` may replace the
    handlers. Each reports ``utils[i]`` as CPU and 100 requests/s through its recorder."""
    handles = []
    for i, u in enumerate(utils):
        server = grpc.server(futures.ThreadPoolExecutor(8))

        def unary(req: bytes, ctx: grpc.ServicerContext, i: int = i) -> bytes:
            return str(i).encode()

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "orca.e2e.E", {"U": grpc.unary_unary_rpc_method_handler(unary)}),))
        h = waypost.serve(server, "orca.e2e", listen_on="127.0.0.1:0", registry=None)
        if u is not None:
            h.orca_recorder.set_cpu_utilization(u)
            h.orca_recorder.set_qps(100)
        handles.append(h)
    return handles


def measure(ch, n: int = 600) -> list[int]:  # type: ignore[no-untyped-def]
    m = ch.unary_unary("/orca.e2e.E/U")
    counts = collections.Counter(m(b"", timeout=10) for _ in range(n))
    return [counts[str(i).encode()] for i in range(3)]


@pytest.fixture
def fast_oob():
    orca.configure(min_interval=0.05)
    yield
    orca.configure(min_interval=1.0)


@pytest.mark.parametrize("oob", [False, True], ids=["per_call", "oob"])
def test_a58_over_three_waypost_servers(oob, fast_oob):
    handles = start_servers([0.9, 0.3, 0.1])
    try:
        cfg = {**CONFIG, "enableOobLoadReport": oob, "oobReportingPeriod": "0.1s"}
        target = "direct:///" + ",".join(h.address for h in handles)
        with waypost.dial(target, service_config={"loadBalancingConfig": [{"weighted_round_robin": cfg}]}) as ch:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # warm up until the weights count (bounded)
                measure(ch, 30)
                if all(w > 0 for w in ch.balancer.policy.weights().values()):
                    break
                time.sleep(0.1)
            time.sleep(0.2)
            got = measure(ch)
            streams = [h.server._state.interceptor_pipeline.interceptors[0].oob for h in handles]
            assert [s.open_streams for s in streams] == ([1, 1, 1] if oob else [0, 0, 0])
        # closing the channel ends its out-of-band streams
        wait_until(lambda: [s.open_streams for s in streams] == [0, 0, 0], 10, "OOB streams closed")
        print(f"A58 {'oob' if oob else 'per call'} over waypost servers reporting cpu 0.9/0.3/0.1: {got} of 600 "
              "(expected 46/138/415)")
        for g, e in zip(got, [46, 138, 415]):
            assert abs(g - e) <= max(12, e * 0.15), got
    finally:
        for h in handles:
            h.stop(0)


def _misbehaving(kind: str) -> grpc.Server:
    """A real grpcio server (not waypost's) whose load reports are broken in one way."""
    nan = report_bytes(cpu_utilization=float("nan"), rps_fractional=100)
    neg = report_bytes(cpu_utilization=-1, rps_fractional=100)
    big = report_bytes(cpu_utilization=0.5, mem_utilization=2.0, rps_fractional=100)
    trailer = {"garbage": b"\x0a\xff\xff\xff", "nan": nan, "negative": neg, "over_one": big, "silent": None}[kind]

    def unary(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        if trailer is not None:
            ctx.set_trailing_metadata(((orca.MIRROR_KEY, trailer),))
        return kind.encode()

    def oob(req: bytes, ctx: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        for _ in range(50):
            if trailer is None:
                ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "no ORCA here")
            yield trailer
            time.sleep(0.05)

    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("orca.e2e.E", {
        "U": grpc.unary_unary_rpc_method_handler(unary)}), grpc.method_handlers_generic_handler(
        orca.SERVICE, {"StreamCoreMetrics": grpc.unary_stream_rpc_method_handler(oob)})))
    return server


@pytest.mark.parametrize("oob", [False, True], ids=["per_call", "oob"])
def test_bad_reports_from_real_servers_fall_back_to_equal_weights(oob, caplog):
    kinds = ["garbage", "nan", "negative", "over_one", "silent"]
    servers, addrs = [], []
    for k in kinds:
        s = _misbehaving(k)
        addrs.append(f"127.0.0.1:{s.add_insecure_port('127.0.0.1:0')}")
        s.start()
        servers.append(s)
    caplog.set_level(logging.WARNING, logger="waypost.balancer.weighted_round_robin")
    try:
        cfg = {"blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s", "enableOobLoadReport": oob,
               "oobReportingPeriod": "0.05s"}
        with waypost.dial("direct:///" + ",".join(addrs),
                          service_config={"loadBalancingConfig": [{"weighted_round_robin": cfg}]}) as ch:
            m = ch.unary_unary("/orca.e2e.E/U")
            for _ in range(100):
                m(b"", timeout=10)
            time.sleep(0.5)
            counts = collections.Counter(m(b"", timeout=10) for _ in range(500))  # no call fails
            assert set(ch.balancer.policy.weights().values()) == {0.0}
        print(f"bad reports ({'oob' if oob else 'per call'}): {dict(counts)}")
        assert len(counts) == 5 and all(abs(v - 100) <= 5 for v in counts.values())  # equal weights
        logged = [r.message for r in caplog.records if "ignoring a load report" in r.message]
        assert len(logged) == 4, logged  # each bad backend once; the silent one is just unweighted
    finally:
        for s in servers:
            s.stop(0)


@pytest.mark.parametrize("oob", [False, True], ids=["per_call", "oob"])
async def test_a58_on_an_aio_channel(oob, fast_oob):
    handles = start_servers([0.9, 0.3, 0.1])
    try:
        cfg = {**CONFIG, "enableOobLoadReport": oob, "oobReportingPeriod": "0.1s"}
        target = "direct:///" + ",".join(h.address for h in handles)
        async with waypost.aio.dial(target,
                                    service_config={"loadBalancingConfig": [{"weighted_round_robin": cfg}]}) as ch:
            m = ch.unary_unary("/orca.e2e.E/U")
            policy = ch.balancer.policy
            for _ in range(100):  # bounded warm-up until every backend has a weight
                for _ in range(10):
                    await m(b"", timeout=10)
                if all(w > 0 for w in policy.weights().values()):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.2)
            counts = collections.Counter([await m(b"", timeout=10) for _ in range(600)])
        got = [counts[str(i).encode()] for i in range(3)]
        print(f"A58 aio {'oob' if oob else 'per call'}: {got} of 600 (expected 46/138/415)")
        for g, e in zip(got, [46, 138, 415]):
            assert abs(g - e) <= max(12, e * 0.15), got
    finally:
        for h in handles:
            h.stop(0)
