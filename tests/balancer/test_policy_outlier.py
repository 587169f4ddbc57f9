"""outlier_detection (gRPC A50) over a child policy, on a fake clock."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.outlier_detection import OutlierConfig
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig, NoBackendAvailable

ADDRS = [f"b{i}" for i in range(5)]
FAIL = Outcome(grpc.StatusCode.UNAVAILABLE, 0.001)
OK = Outcome(grpc.StatusCode.OK, 0.001)


def make(clock, **cfg):
    base = {"interval": "10s", "baseEjectionTime": "30s", "childPolicy": [{"round_robin": {}}]}
    base.update(cfg)
    policy_cls = get_policy("outlier_detection")
    return policy_cls(policy_cls.parse_config(base, "lb[0].outlier_detection"), clock=clock, rng=random.Random(3))


def drive(picker, n: int, failing: dict[str, float], rng: random.Random) -> Counter:
    """n calls; a backend in ``failing`` fails with that probability (1.0: always)."""
    counts: Counter = Counter()
    for _ in range(n):
        res = picker.pick(PickInfo())
        counts[res.backend.address] += 1
        res.done(FAIL if rng.random() < failing.get(res.backend.address, 0.0) else OK)
    return counts


FP = {"failurePercentageEjection": {"threshold": 50, "requestVolume": 10, "minimumHosts": 5}}


def test_failure_percentage_ejects_then_uneject_after_base_time():
    clock = FakeClock()
    policy = make(clock, maxEjectionPercent=20, **FP)
    picker = policy.build(bs(ADDRS))
    rng = random.Random(1)
    drive(picker, 100, {"b2": 1.0}, rng)
    assert policy.ejected() == set()
    clock.now = 10.0  # interval passed: the next pick evaluates
    counts = drive(picker, 100, {"b2": 1.0}, rng)
    assert policy.ejected() == {"b2"}
    assert "b2" not in counts and sum(counts.values()) == 100
    for t in (20.0, 30.0):  # still within 30 s of the ejection at t=10
        clock.now = t
        drive(picker, 20, {}, rng)
        assert policy.ejected() == {"b2"}
    clock.now = 40.0  # 30 s after ejection, at an evaluation
    counts = drive(picker, 100, {}, rng)
    assert policy.ejected() == set()
    assert counts["b2"] == 20


def test_success_rate_ejection():
    clock = FakeClock()
    sr = {"successRateEjection": {"stdevFactor": 1000, "requestVolume": 10, "minimumHosts": 5}}
    policy = make(clock, maxEjectionPercent=20, **sr)
    picker = policy.build(bs(ADDRS))
    rng = random.Random(2)
    drive(picker, 500, {"b4": 0.5}, rng)  # rates ~ 1,1,1,1,0.5: threshold = mean - 1 stdev ~ 0.7
    clock.now = 10.0
    drive(picker, 1, {}, rng)
    assert policy.ejected() == {"b4"}


def test_max_ejection_percent_limits_and_allows_at_least_one():
    rng = random.Random(3)
    for pct, expected in ((20, 1), (10, 1), (40, 2), (0, 0)):
        clock = FakeClock()
        policy = make(clock, maxEjectionPercent=pct, **FP)
        picker = policy.build(bs(ADDRS))
        drive(picker, 200, {"b1": 1.0, "b3": 1.0}, rng)
        clock.now = 10.0
        drive(picker, 1, {}, rng)
        assert len(policy.ejected()) == expected, pct
        assert policy.ejected() <= {"b1", "b3"}


def test_ejection_multiplier_grows_and_caps():
    clock = FakeClock()
    policy = make(clock, maxEjectionPercent=20, maxEjectionTime="50s", **FP)
    picker = policy.build(bs(ADDRS))
    rng = random.Random(4)
    drive(picker, 100, {"b0": 1.0}, rng)
    clock.now = 10.0
    drive(picker, 1, {}, rng)
    assert policy.ejected() == {"b0"}  # multiplier 1: 30 s
    clock.now = 40.0
    drive(picker, 100, {"b0": 1.0}, rng)  # un-ejected at 40, fails again
    assert policy.ejected() == set()
    clock.now = 50.0
    drive(picker, 1, {}, rng)
    assert policy.ejected() == {"b0"}  # multiplier 2: min(60 s, max(30, 50)) = 50 s
    for t in (60.0, 70.0, 80.0, 90.0):
        clock.now = t
        drive(picker, 1, {}, rng)
        assert policy.ejected() == {"b0"}, t
    clock.now = 100.0
    drive(picker, 1, {}, rng)
    assert policy.ejected() == set()


def test_no_ejection_below_minimum_hosts_volume_or_enforcement():
    rng = random.Random(5)
    cases = [
        {"failurePercentageEjection": {"threshold": 50, "requestVolume": 10, "minimumHosts": 6}},
        {"failurePercentageEjection": {"threshold": 50, "requestVolume": 1000, "minimumHosts": 5}},
        {"failurePercentageEjection": {"threshold": 50, "requestVolume": 10, "minimumHosts": 5,
                                       "enforcementPercentage": 0}},
        {},  # no algorithm configured: A50 disables both
    ]
    for cfg in cases:
        clock = FakeClock()
        policy = make(clock, maxEjectionPercent=50, **cfg)
        picker = policy.build(bs(ADDRS))
        drive(picker, 200, {"b2": 1.0}, rng)
        clock.now = 10.0
        drive(picker, 1, {}, rng)
        assert policy.ejected() == set(), cfg


def test_only_failure_codes_count():
    clock = FakeClock()
    policy = make(clock, maxEjectionPercent=20, **FP)
    picker = policy.build(bs(ADDRS))
    for _ in range(100):
        res = picker.pick(PickInfo())
        code = grpc.StatusCode.NOT_FOUND if res.backend.address == "b1" else grpc.StatusCode.OK
        res.done(Outcome(code, 0.001))
    clock.now = 10.0
    picker.pick(PickInfo()).done(OK)
    assert policy.ejected() == set()


def test_all_ejected_with_100_percent_fails_picks():
    clock = FakeClock()
    cfg = {"failurePercentageEjection": {"threshold": 50, "requestVolume": 10, "minimumHosts": 2}}
    policy = make(clock, maxEjectionPercent=100, **cfg)
    picker = policy.build(bs(["x", "y"]))
    drive(picker, 40, {"x": 1.0, "y": 1.0}, random.Random(6))
    clock.now = 10.0
    with pytest.raises(NoBackendAvailable):
        picker.pick(PickInfo())
    assert policy.ejected() == {"x", "y"}


def test_ejection_survives_rebuild_and_child_sees_non_ejected_only():
    clock = FakeClock()
    cfg = {**FP, "childPolicy": [{"no_such_policy": {}}, {"p2c_ewma": {}}]}
    policy = make(clock, maxEjectionPercent=20, **cfg)
    assert policy.child.name == "p2c_ewma"
    picker = policy.build(bs(ADDRS))
    rng = random.Random(7)
    drive(picker, 200, {"b3": 1.0}, rng)
    clock.now = 10.0
    drive(picker, 1, {}, rng)
    assert policy.ejected() == {"b3"}
    picker = policy.build(bs([*ADDRS, "b5"]))
    assert policy.ejected() == {"b3"}
    counts = drive(picker, 300, {}, rng)
    assert "b3" not in counts and counts["b5"] > 0
    assert set(policy.child.snapshot()) == {"b0", "b1", "b2", "b4", "b5"}  # the child's build set
    assert all(s["inflight"] == 0 for s in policy.child.snapshot().values())  # child done hooks ran
    policy.build(bs(ADDRS[:3]))  # b3 removed: its ejection state goes
    policy.build(bs(ADDRS))
    assert policy.ejected() == set()


def test_durations_are_strict_grpc_json_durations():
    s = OutlierConfig.parse({"interval": "0.25s", "baseEjectionTime": "0s", "maxEjectionTime": "10s"}, "p")
    assert (s.interval, s.base_ejection_time, s.max_ejection_time) == (0.25, 0.0, 10.0)
    for bad in (3, "10", "-1s", "1m", "", None, True, "1.5 s"):
        with pytest.raises(InvalidServiceConfig, match="^p.baseEjectionTime: expected a duration"):
            OutlierConfig.parse({"baseEjectionTime": bad}, "p")
    with pytest.raises(InvalidServiceConfig, match="^p.interval: expected a duration > 0s"):
        OutlierConfig.parse({"interval": "0s"}, "p")


def test_defaults():
    s = OutlierConfig.parse({}, "p")
    assert (s.interval, s.base_ejection_time, s.max_ejection_time, s.max_ejection_percent) == (10.0, 30.0, 300.0, 10)
    assert s.success_rate is None and s.failure_percentage is None
    assert (s.child_name, s.child_config) == ("round_robin", {})
    s = OutlierConfig.parse({"successRateEjection": {}, "failurePercentageEjection": {}}, "p")
    assert s.success_rate == {"stdevFactor": 1900, "enforcementPercentage": 100, "minimumHosts": 5, "requestVolume": 100}
    assert s.failure_percentage == {"threshold": 85, "enforcementPercentage": 100, "minimumHosts": 5, "requestVolume": 50}


@pytest.mark.parametrize(
    ("cfg", "where"),
    [
        ({"interval": "0s"}, "p.interval"),
        ({"interval": 10}, "p.interval"),
        ({"baseEjectionTime": "thirty"}, "p.baseEjectionTime"),
        ({"maxEjectionTime": -1}, "p.maxEjectionTime"),
        ({"maxEjectionPercent": 101}, "p.maxEjectionPercent"),
        ({"maxEjectionPercent": "10"}, "p.maxEjectionPercent"),
        ({"successRateEjection": {"stdevFactor": -1}}, "p.successRateEjection.stdevFactor"),
        ({"successRateEjection": {"enforcementPercentage": 150}}, "p.successRateEjection.enforcementPercentage"),
        ({"successRateEjection": []}, "p.successRateEjection"),
        ({"failurePercentageEjection": {"threshold": 101}}, "p.failurePercentageEjection.threshold"),
        ({"failurePercentageEjection": {"minHosts": 1}}, "p.failurePercentageEjection.minHosts"),
        ({"childPolicy": []}, "p.childPolicy"),
        ({"childPolicy": [{"nope": {}}]}, "p.childPolicy"),
        ({"childPolicy": [{"least_request": {"choiceCount": 1}}]}, r"p.childPolicy\[0\].least_request.choiceCount"),
        ({"childPolicy": [{"a": {}, "b": {}}]}, r"p.childPolicy\[0\]"),
        ({"intervall": "1s"}, "p.intervall"),
    ],
)
def test_config_validation(cfg, where):
    cls = get_policy("outlier_detection")
    with pytest.raises(InvalidServiceConfig, match="^" + where.replace(".", r"\.").replace(r"\\.", r"\.")) as ei:
        cls.parse_config(cfg, "p")
    if cfg.get("childPolicy") == [{"nope": {}}]:
        assert "round_robin" in str(ei.value)  # lists the known policies
