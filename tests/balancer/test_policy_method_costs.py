"""methodCosts: a call of a listed method counts as that many calls in flight (least_request, peak_ewma)."""

from __future__ import annotations

import random

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig
from waypost.service_config import parse_service_config

OK = grpc.StatusCode.OK
HEAVY = PickInfo(method="/pkg.Svc/Heavy")
LIGHT = PickInfo(method="/pkg.Svc/Light")
COSTED = ["least_request", "peak_ewma"]


def make(name: str, clock: FakeClock | None = None, seed: int = 1, **config):
    cls = get_policy(name)
    cfg = cls.parse_config({"methodCosts": {"/pkg.Svc/Heavy": 5}, **config}, f"lb.{name}")
    return cls(cfg, clock=clock or FakeClock(10.0), rng=random.Random(seed))


def inflight(policy) -> dict[str, float]:
    if hasattr(policy, "inflight"):
        return policy.inflight()
    return {a: s["inflight"] for a, s in policy.snapshot().items()}


@pytest.mark.parametrize("name", COSTED)
def test_a_heavy_call_counts_its_cost_until_it_ends(name):
    policy = make(name)
    picker = policy.build(bs("a"))
    heavy, light = picker.pick(HEAVY), picker.pick(LIGHT)
    assert inflight(policy) == {"a": 6}
    heavy.done(Outcome(OK, 0.01))
    assert inflight(policy) == {"a": 1}
    light.done(Outcome(OK, 0.01))
    assert inflight(policy) == {"a": 0}


@pytest.mark.parametrize("name", COSTED)
def test_one_heavy_call_weighs_like_five_light_ones(name):
    clock = FakeClock(10.0)
    extra = {"choiceCount": 10} if name == "least_request" else {}  # 10 draws of 2: both nearly always drawn
    for costed in (True, False):
        cls = get_policy(name)
        raw = {"methodCosts": {"/pkg.Svc/Heavy": 5}} if costed else {}
        policy = cls(cls.parse_config({**raw, **extra}, "p"), clock=clock, rng=random.Random(2))
        picker = policy.build(bs("a", "b"))
        for _ in range(6):  # both measured alike
            picker.pick(LIGHT).done(Outcome(OK, 0.01))
        heavy = picker.pick(HEAVY)
        light = [picker.pick(LIGHT) for _ in range(4)]
        others = [r.backend.address for r in light if r.backend.address != heavy.backend.address]
        if costed:  # the heavy call's backend counts 5: the next four light calls go to the other one
            assert len(others) == 4
        else:  # counted as one call: they are shared
            assert len(others) < 4
        for r in [heavy, *light]:
            r.done(Outcome(OK, 0.01))
        assert set(inflight(policy).values()) == {0}


@pytest.mark.parametrize("name", COSTED)
def test_costs_parsed_through_the_service_config(name):
    cfg = parse_service_config({"loadBalancingConfig": [{name: {"methodCosts": {"/a.B/C": 3.0, "/a.B/D": 1}}}]})
    assert cfg.lb_config == {"methodCosts": {"/a.B/C": 3, "/a.B/D": 1}}


@pytest.mark.parametrize("name", COSTED)
@pytest.mark.parametrize(("value", "where"), [
    ([], r"p\.methodCosts: expected a JSON object"),
    ({"Heavy": 2}, r"p\.methodCosts\['Heavy'\]: expected a full method name"),
    ({"/pkg.Svc/": 2}, r"p\.methodCosts\['/pkg.Svc/'\]: expected a full method name"),
    ({"/a/b/c": 2}, r"p\.methodCosts\['/a/b/c'\]: expected a full method name"),
    ({"/a.B/C": 0}, r"p\.methodCosts\['/a.B/C'\]: expected a whole number from 1 to 1000, got 0"),
    ({"/a.B/C": 1.5}, r"p\.methodCosts\['/a.B/C'\]: expected a whole number"),
    ({"/a.B/C": True}, r"p\.methodCosts\['/a.B/C'\]: expected a whole number"),
    ({"/a.B/C": 1001}, r"p\.methodCosts\['/a.B/C'\]: expected a whole number"),
    ({"/a.B/C": "5"}, r"p\.methodCosts\['/a.B/C'\]: expected a whole number"),
])
def test_bad_costs_name_the_path(name, value, where):
    with pytest.raises(InvalidServiceConfig, match="^" + where):
        get_policy(name).parse_config({"methodCosts": value}, "p")


def test_prequal_does_not_take_method_costs():
    with pytest.raises(InvalidServiceConfig, match=r"^p\.methodCosts: unknown field for prequal"):
        get_policy("prequal").parse_config({"methodCosts": {"/a.B/C": 2}}, "p")


def test_real_channel_counts_the_configured_cost_and_releases_it():
    import waypost
    from harness.backends import echo_pb2, echo_pb2_grpc
    from harness.waiting import wait_until
    from tests.channel.support import direct, echo_servers

    cfg = {"loadBalancingConfig": [{"least_request": {"methodCosts": {"/waypost.test.Echo/Unary": 7},
                                                      "slowStartWindow": "10s"}}]}
    with echo_servers("a", "b") as srv, waypost.dial(direct(srv), service_config=cfg) as ch:
        policy = ch.balancer.policy
        assert policy.name == "least_request" and policy.costs == {"/waypost.test.Echo/Unary": 7}
        assert policy.slow_start.window == 10.0
        stub = echo_pb2_grpc.EchoStub(ch)
        fut = stub.Unary.future(echo_pb2.EchoRequest(message="x", delay_ms=3000))
        wait_until(lambda: sorted(policy.inflight().values()) == [0, 7], 10, what="the slow call counted as 7")
        assert fut.result(timeout=20).message == "x"
        assert {stub.Unary(echo_pb2.EchoRequest(), timeout=20).server for _ in range(20)} <= {"a", "b"}
        assert set(policy.inflight().values()) == {0}  # every call released its 7
