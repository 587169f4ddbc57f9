"""gRFC A78's load-balancing metrics through waypost.otel: weighted_round_robin's scheduler updates on the
policy's own clock, pick_first's connection events from its ``connections`` calls and over real servers."""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import waypost
import waypost.otel
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.channel.support import direct
from waypost import orca
from waypost.balancer.base import PickInfo
from waypost.balancer.pick_first import PickFirstPolicy
from waypost.balancer.weighted_round_robin import OrcaWeightedRoundRobinPolicy
from waypost.orca import _protos
from waypost.types import CONNECTING, READY, TRANSIENT_FAILURE, Backend

ADDRS = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    r = InMemoryMetricReader()
    waypost.otel.enable(meter_provider=MeterProvider(metric_readers=[r]), tracing=False)
    try:
        yield r
    finally:
        waypost.otel.disable()


def values(reader: InMemoryMetricReader, prefix: str) -> dict[str, object]:
    """name -> value (counters) or (count, sum) (histograms), for ``grpc.target`` = "t" only."""
    out: dict[str, object] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if not m.name.startswith(prefix):
                    continue
                for p in m.data.data_points:
                    assert dict(p.attributes) == {"grpc.target": "t"}
                    out[m.name] = p.value if hasattr(p, "value") else (p.count, p.sum)
    return out


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.skipif(_protos.protos() is None, reason="ORCA reports need xds-protos (the xds extra)")
def test_wrr_scheduler_updates_count_unusable_stale_weights_and_round_robin_fallbacks(reader):
    clock = Clock()
    cfg = OrcaWeightedRoundRobinPolicy.parse_config({"blackoutPeriod": "10s", "weightExpirationPeriod": "60s",
                                                     "weightUpdatePeriod": "1s"}, "lb")
    policy = OrcaWeightedRoundRobinPolicy(cfg, clock=clock, rng=random.Random(1))
    policy.target = "t"  # what the channel sets
    picker = policy.build([Backend(a) for a in ADDRS])  # update 1: no report yet

    def feed() -> None:
        for a in ADDRS:
            msg = _protos.protos()[0].OrcaLoadReport(cpu_utilization=0.5, rps_fractional=100.0)
            policy.on_load_report(a, orca.parse_report(msg.SerializeToString()))

    feed()
    clock.t += 11
    feed()
    picker.pick(PickInfo("/s/M"))  # update 2: three usable weights of 200
    clock.t += 120
    picker.pick(PickInfo("/s/M"))  # update 3: all three expired
    got = values(reader, "grpc.lb.wrr.")
    assert got == {"grpc.lb.wrr.rr_fallback": 2, "grpc.lb.wrr.endpoint_weight_not_yet_usable": 3,
                   "grpc.lb.wrr.endpoint_weight_stale": 3, "grpc.lb.wrr.endpoint_weights": (9, 600.0)}


def test_pick_first_connection_events_from_its_connections_calls(reader):
    policy = PickFirstPolicy(None, clock=Clock())
    policy.target = "t"
    backends = [Backend(a) for a in ADDRS[:2]]
    policy.connections(backends, {})
    policy.connections(backends, {ADDRS[0]: CONNECTING})
    policy.connections(backends, {ADDRS[0]: TRANSIENT_FAILURE})  # attempt failed
    policy.connections(backends, {ADDRS[0]: TRANSIENT_FAILURE, ADDRS[1]: READY})  # the next one succeeded
    policy.build([backends[1]])
    policy.connections(backends, {ADDRS[0]: TRANSIENT_FAILURE, ADDRS[1]: TRANSIENT_FAILURE})  # the one in use lost
    assert values(reader, "grpc.lb.pick_first.") == {"grpc.lb.pick_first.connection_attempts_failed": 1,
                                                      "grpc.lb.pick_first.connection_attempts_succeeded": 1,
                                                      "grpc.lb.pick_first.disconnections": 1}


def test_pick_first_over_real_servers_counts_the_disconnection_of_the_backend_in_use(reader):
    a, b = EchoServer("a").start(), EchoServer("b").start()
    try:
        target = direct([a, b])
        with waypost.dial(target, balancer="pick_first") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert stub.Unary(echo_pb2.EchoRequest(), timeout=20).server == "a"
            a.stop(0)

            def answers() -> str | None:
                try:
                    return stub.Unary(echo_pb2.EchoRequest(), timeout=5).server  # type: ignore[no-any-return]
                except grpc.RpcError:  # a call caught by the stop: the next one goes to b
                    return None

            wait_until(lambda: answers() == "b", 30)
        got: dict[str, int] = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name.startswith("grpc.lb.pick_first."):
                        for p in m.data.data_points:
                            assert p.attributes["grpc.target"] == target
                            got[m.name] = p.value
        assert got["grpc.lb.pick_first.disconnections"] == 1
        assert got["grpc.lb.pick_first.connection_attempts_succeeded"] == 2  # a, then b
    finally:
        a.stop(0)
        b.stop(0)
