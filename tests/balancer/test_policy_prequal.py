"""prequal: probe scheduling, the pool's HCL choice, the peak_ewma fallback, removal; fake clock, seeded rng and a
recording prober (the real prober is exercised against real servers in test_prequal_channel.py)."""

from __future__ import annotations

import logging
import math
import random
from collections import Counter

import grpc
import pytest

from tests.balancer.support import FakeClock, bs
from waypost.balancer import prequal
from waypost.balancer.base import Outcome, PickInfo
from waypost.balancer.policies import get_policy
from waypost.errors import InvalidServiceConfig, NoBackendAvailable
from waypost.orca import call_load
from waypost.service_config import parse_service_config

OK = grpc.StatusCode.OK
INFO = PickInfo()


class RecordingProber:
    """Records the probes asked for; ``accept`` False plays a channel that cannot send now."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.accept = True

    def probe(self, address: str) -> bool:
        if self.accept:
            self.sent.append(address)
        return self.accept


def make(clock: FakeClock, seed: int = 1, **config):
    policy = get_policy("prequal")(config, clock=clock, rng=random.Random(seed))
    prober = RecordingProber()
    policy.attach_prober(prober)
    return policy, prober


def pick(picker) -> str:
    res = picker.pick(INFO)
    res.done(Outcome(OK, 0.001))
    return res.backend.address


def test_registered_wants_reports_and_empty_picker_fails():
    policy, _ = make(FakeClock())
    assert policy.name == "prequal" and policy.wants_load_reports
    assert not get_policy("peak_ewma").wants_load_reports
    with pytest.raises(NoBackendAvailable):
        policy.build([]).pick(INFO)


def test_probes_follow_the_picks_within_the_rate_cap():
    clock = FakeClock(10.0)
    policy, prober = make(clock, probesPerPick=1, maxProbeRate=10)  # burst of 1 token, one more every 0.1 s
    picker = policy.build(bs("a", "b", "c", "d"))
    pick(picker)
    assert len(prober.sent) == 1  # the first pick earns a probe and the bucket has a token
    policy.on_probe(prober.sent[0], 0, 0.001)
    for _ in range(5):
        pick(picker)
    assert len(prober.sent) == 1  # same instant: no token left
    clock.now += 0.05
    pick(picker)
    assert len(prober.sent) == 1  # half a token
    clock.now += 0.06
    pick(picker)
    assert len(prober.sent) == 2
    assert policy.probes_sent == 2


def test_probes_per_pick_below_one_probe_every_other_pick():
    clock = FakeClock(10.0)
    policy, prober = make(clock, probesPerPick=0.5, maxProbeRate=1000)
    picker = policy.build(bs("a", "b", "c", "d"))
    for _ in range(8):
        clock.now += 0.01
        pick(picker)
        for addr in prober.sent:  # answer at once, so no backend stays "outstanding"
            policy.on_probe(addr, 0, 0.001)
    assert len(prober.sent) == 4


def test_no_probes_when_probes_per_pick_is_zero():
    clock = FakeClock(10.0)
    policy, prober = make(clock, probesPerPick=0)
    picker = policy.build(bs("a", "b"))
    for _ in range(20):
        clock.now += 0.5
        pick(picker)
    assert prober.sent == [] and policy.probe_picks == 0


def test_targets_are_drawn_among_ready_backends_only():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=1000)
    picker = policy.build(bs("a", "b", "c", "d"))
    for _ in range(200):
        clock.now += 0.01
        pick(picker)
        while prober.sent:
            policy.on_probe(prober.sent.pop(), 0, 0.001)
    drawn = Counter()
    picker = policy.build(bs("a", "b"))  # c and d leave
    for _ in range(100):
        clock.now += 0.01
        pick(picker)
        for addr in prober.sent:
            drawn[addr] += 1
            policy.on_probe(addr, 0, 0.001)
        prober.sent.clear()
    assert set(drawn) == {"a", "b"}


def test_one_outstanding_probe_per_backend():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=1000, probeTimeout=0.25)
    picker = policy.build(bs("a"))
    for _ in range(10):
        clock.now += 0.01
        pick(picker)
    assert prober.sent == ["a"]  # no answer yet: not asked again
    clock.now += 0.5  # two probe timeouts: the answer is taken as lost
    pick(picker)
    assert prober.sent == ["a", "a"]


def test_hcl_picks_the_cold_backend_with_the_lowest_latency():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=0.5)
    picker = policy.build(bs("a", "b", "c"))
    policy.on_probe("a", 2, 0.010)
    policy.on_probe("b", 1, 0.050)
    policy.on_probe("c", 9, 0.020)  # 9 in flight: hot
    assert pick(picker) == "a"
    assert policy.probe_picks == 1
    # the call is counted in peak_ewma's statistics too (one set of statistics, whichever way it was chosen)
    res = picker.pick(INFO)
    assert policy.fallback.snapshot()[res.backend.address]["inflight"] == 1
    res.done(Outcome(OK, 0.001))


def test_a_cold_backend_slower_than_a_hot_one_lets_peak_ewma_decide():
    # cold because it is slow (its few calls keep its RIF low): HCL would send it every pick; peak_ewma decides
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=0.5)
    picker = policy.build(bs("a", "b", "c"))
    policy.on_probe("a", 2, 0.010)
    policy.on_probe("b", 1, 0.050)
    policy.on_probe("c", 9, 0.001)  # hot, but the server says a call there takes 1 ms
    pick(picker)
    assert policy.probe_picks == 0


def test_our_calls_since_the_report_make_a_backend_hot():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=1.0)
    picker = policy.build(bs("a", "b"))
    policy.on_probe("a", 0, 0.001)
    policy.on_probe("b", 0, 0.002)
    held = picker.pick(INFO)  # not done: our call stays in flight at a
    assert held.backend.address == "a"
    assert picker.pick(INFO).backend.address == "b"  # a now has one more call than reported: hot


def test_a_server_without_an_estimate_yet_counts_as_fast_as_the_fastest_and_gets_its_share():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=0.84)
    picker = policy.build(bs("a", "b", "c"))
    policy.on_probe("a", 1, 0.004)
    policy.on_probe("b", 1, 0.005)
    policy.on_probe("c", 1, 0.040)
    picker = policy.build(bs("a", "b", "c", "new"))
    policy.on_probe("new", 0, None)  # just started: no call ended there yet
    assert policy.pool()[-1].latency == pytest.approx(0.004)  # the fastest fresh probe's, not 30 ms
    held = [picker.pick(INFO) for _ in range(4)]  # calls kept in flight
    got = Counter(r.backend.address for r in held)
    # tried at once (it ties with the fastest), but our calls there scale its latency and make it hot: it shares
    # with the fast ones. (Once the fast ones are loaded above the slow one's 40 ms, the pool contradicts itself
    # and peak_ewma decides: this client never called c, so c may get one call there.)
    assert 1 <= got["new"] <= 2 and got["a"] >= 1 and got["c"] <= 1, got
    for r in held:
        r.done(Outcome(OK, 0.004))


def test_a_pool_of_hot_probes_only_lets_peak_ewma_decide():
    # the probes left are those of overloaded backends (the cold ones were used up): do not herd onto them
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=0.5)
    picker = policy.build(bs("a", "b", "c", "d"))
    for rif in (0, 0, 0, 0, 0):
        policy.on_probe("c", rif, 0.001)  # a calm history of reports...
        policy.on_probe("d", rif, 0.001)
    policy.on_probe("c", 40, 0.5)  # ...then c and d report 40 and 70 calls in flight
    policy.on_probe("d", 70, 0.8)
    got = Counter(pick(picker) for _ in range(40))
    assert policy.probe_picks == 0 and got["a"] + got["b"] > 0, got  # peak_ewma's P2C over all four


def test_a_backend_that_fails_fast_does_not_look_fast():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=1.0)
    picker = policy.build(bs("a", "b"))
    for _ in range(6):
        res = picker.pick(INFO)
        res.done(Outcome(grpc.StatusCode.UNAVAILABLE if res.backend.address == "a" else OK, 0.001))
    policy.on_probe("a", 0, 0.001)  # the server's estimate counts its fast failures as fast
    policy.on_probe("b", 0, 0.010)
    before = policy.probe_picks
    assert Counter(pick(picker) for _ in range(10)) == {"b": 10}  # a's failure penalty: peak_ewma decides
    assert policy.probe_picks - before < 10


def test_no_usable_probe_falls_back_to_peak_ewma():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, maxProbeAge=1.0)
    picker = policy.build(bs("a", "b"))
    for _ in range(30):  # teach peak_ewma that b is slow
        res = picker.pick(INFO)
        res.done(Outcome(OK, 0.5 if res.backend.address == "b" else 0.001))
    assert policy.probe_picks == 0
    assert Counter(pick(picker) for _ in range(50))["a"] == 50
    policy.on_probe("b", 0, 0.0001)  # one probe only: HCL has no choice to make, peak_ewma decides
    assert pick(picker) == "a" and policy.probe_picks == 0
    policy.on_probe("a", 0, 0.001)
    clock.now += 1.5  # both probes too old
    assert pick(picker) == "a" and policy.probe_picks == 0


def test_backend_without_reports_is_not_probed_again_and_joins_with_the_local_view():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=1000)
    picker = policy.build(bs("a", "b"))
    for _ in range(50):
        clock.now += 0.01
        pick(picker)
        for addr in prober.sent:
            if addr == "a":
                policy.on_probe_failed("a", True)
            else:
                policy.on_probe("b", 0, 0.001)
        prober.sent.clear()
        if policy.without_reports():
            break
    assert policy.without_reports() == {"a"}
    local_views = 0
    for _ in range(50):
        clock.now += 0.01
        pick(picker)
        assert "a" not in prober.sent
        for addr in prober.sent:
            policy.on_probe(addr, 0, 0.001)
        prober.sent.clear()
        local_views += any(p.address == "a" for p in policy.pool())
    assert local_views > 0  # a competes in the pool with this client's view of it
    picker = policy.build(bs("b"))
    policy.build(bs("a", "b"))  # a left and came back: asked again (it may have been upgraded)
    assert policy.without_reports() == set()


def test_a_failed_probe_pauses_that_backend():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=1000)
    picker = policy.build(bs("a"))
    pick(picker)
    assert prober.sent == ["a"]
    policy.on_probe_failed("a", False)
    for _ in range(5):
        clock.now += prequal.PROBE_PAUSE / 10
        pick(picker)
    assert prober.sent == ["a"]
    clock.now += prequal.PROBE_PAUSE
    pick(picker)
    assert prober.sent == ["a", "a"]


def test_removed_backend_leaves_the_pool_and_its_late_answer_is_ignored():
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0, reuseBudget=1000)
    policy.build(bs("a", "b", "c"))
    policy.on_probe("a", 0, 0.001)
    policy.on_probe("b", 0, 0.002)
    picker = policy.build(bs("b", "c"))
    assert {p.address for p in policy.pool()} == {"b"}
    policy.on_probe("a", 0, 0.0001)  # late answer from the removed backend
    assert {p.address for p in policy.pool()} == {"b"}
    policy.on_probe("c", 0, 0.003)
    assert Counter(pick(picker) for _ in range(20)) == {"b": 20}


def test_a_probe_the_channel_could_not_send_is_not_counted():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=1000)
    prober.accept = False
    picker = policy.build(bs("a"))
    pick(picker)
    assert policy.probes_sent == 0
    prober.accept = True
    clock.now += 0.01
    pick(picker)  # not blocked as "outstanding" by the probe that was never sent
    assert prober.sent == ["a"] and policy.probes_sent == 1


def test_without_a_prober_picks_still_work():
    policy = get_policy("prequal")({}, clock=FakeClock(1.0), rng=random.Random(3))
    picker = policy.build(bs("a", "b"))
    assert {pick(picker) for _ in range(40)} == {"a", "b"}


def test_automatic_reuse_budget_follows_picks_per_probe():
    clock = FakeClock(10.0)
    policy, prober = make(clock, maxProbeRate=10)
    picker = policy.build(bs("a", "b", "c", "d"))
    for _ in range(399):  # ~400 picks in the first second, probes capped at 10/s
        clock.now += 0.0025
        pick(picker)
        for addr in prober.sent:
            policy.on_probe(addr, 0, 0.001)
        prober.sent.clear()
    sent = policy.probes_sent
    assert 9 <= sent <= 11
    assert policy.reuse_budget == prequal.FIRST_AUTO_REUSE  # not retuned before the window ends
    clock.now = 11.5
    pick(picker)  # the 400th pick closes the window
    assert policy.reuse_budget == math.ceil(prequal.REUSE_FACTOR * 400 / sent)


def test_signals_and_statistics_line(caplog):
    clock = FakeClock(10.0)
    policy, _ = make(clock, probesPerPick=0)
    picker = policy.build(bs("a", "b"))
    policy.on_probe("a", 3, 0.020)
    clock.now += 0.25
    sig = {s.address: s for s in policy.signals()}
    assert (sig["a"].in_flight, sig["a"].latency, sig["a"].probe_age) == (3.0, 0.020, 0.25)
    assert sig["b"].probe_age is None and sig["b"].latency == pytest.approx(policy.fallback.snapshot()["b"]["estimate"])
    clock.now += 61
    with caplog.at_level(logging.INFO, logger="waypost.balancer.peak_ewma"):
        pick(picker)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("prequal - "))
    assert "conn: a" in line and "reported rif: 3" in line and "probe age:" in line and "conn: b" in line


@pytest.mark.parametrize(("field", "value"), [
    ("probesPerPick", -1), ("probesPerPick", "1"), ("maxProbeRate", 0), ("poolSize", 0), ("poolSize", 1.5),
    ("reuseBudget", 0), ("hotQuantile", 0), ("hotQuantile", 1.5), ("maxProbeAge", "0s"), ("probeTimeout", "x"),
    ("decayTime", "-1s"), ("probes", 1),
])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(InvalidServiceConfig, match=rf"prequal\.{field}"):
        parse_service_config({"loadBalancingConfig": [{"prequal": {field: value}}]})


def test_config_parsed_and_applied():
    sc = parse_service_config({"loadBalancingConfig": [{"prequal": {
        "probesPerPick": 2, "maxProbeRate": 50, "poolSize": 8.0, "maxProbeAge": "0.5s", "reuseBudget": 3,
        "hotQuantile": 0.9, "probeTimeout": "0.1s", "decayTime": "5s", "defaultRtt": "0.01s"}}]})
    policy = get_policy(sc.lb_policy)(sc.lb_config, clock=FakeClock(), rng=random.Random(1))
    assert (policy.probes_per_pick, policy.max_probe_rate, policy.probe_timeout, policy.reuse_budget) == \
        (2.0, 50.0, 0.1, 3)
    assert (policy.fallback.decay, policy.fallback.default_rtt) == (5.0, 0.01)


def test_inside_outlier_detection_it_gets_no_prober_and_picks_as_peak_ewma():
    sc = parse_service_config({"loadBalancingConfig": [{"outlier_detection": {"childPolicy": [{"prequal": {}}]}}]})
    policy = get_policy(sc.lb_policy)(sc.lb_config, clock=FakeClock(5.0), rng=random.Random(2))
    assert not policy.wants_load_reports  # the channel attaches no prober to the wrapper, nor to its child
    picker = policy.build(bs("a", "b"))
    assert {pick(picker) for _ in range(40)} == {"a", "b"}
    assert policy.child.probes_sent == 0 and policy.child.probe_picks == 0


def test_a_prober_that_raises_never_fails_the_pick(caplog):
    class Broken:
        def probe(self, address: str) -> bool:
            raise RuntimeError("channel gone")

    clock = FakeClock(10.0)
    policy = get_policy("prequal")({}, clock=clock, rng=random.Random(1))
    policy.attach_prober(Broken())
    picker = policy.build(bs("a", "b"))
    with caplog.at_level(logging.ERROR, logger="waypost.balancer.prequal"):
        assert pick(picker) in {"a", "b"}
    assert "probing" in caplog.text and policy.probes_sent == 0


def test_every_call_reports_the_servers_load_in_its_trailer_without_a_probe():
    clock = FakeClock(10.0)
    policy, prober = make(clock, probesPerPick=0, reuseBudget=1000, hotQuantile=1.0)
    picker = policy.build(bs("a", "b"))
    res = picker.pick(INFO)
    assert res.wants_trailers  # the channel hands the trailer to ``done``
    other = "b" if res.backend.address == "a" else "a"
    trailer = ((call_load.KEY, call_load.encode(3, 0.012)),)
    res.done(Outcome(OK, 0.012, trailer))
    (probe,) = policy.pool()
    assert (probe.address, probe.inflight, probe.latency, probe.own) == (res.backend.address, 3.0, 0.012, 0)
    assert prober.sent == []  # no RPC
    # a malformed or absent trailer is no report, and the call is counted in peak_ewma all the same
    res = picker.pick(INFO)
    res.done(Outcome(OK, 0.001, (("waypost-server-load", "x y"),)))
    res = picker.pick(INFO)
    res.done(Outcome(OK, 0.001, None))
    assert [p.address for p in policy.pool()] == [probe.address]
    assert all(s["inflight"] == 0 for s in policy.fallback.snapshot().values())
    # once both have reported, the pool decides
    res = picker.pick(INFO)
    while res.backend.address != other:
        res.done(Outcome(OK, 0.001))
        res = picker.pick(INFO)
    res.done(Outcome(OK, 0.004, ((call_load.KEY, call_load.encode(0, 0.004)),)))
    before = policy.probe_picks
    assert pick(picker) == other and policy.probe_picks == before + 1


def test_without_load_reports_it_is_peak_ewma():
    # no probe answered and no trailer: the pool is never consulted (peak_ewma's P2C picks)
    clock = FakeClock(10.0)
    policy, _ = make(clock, callReports=False)
    picker = policy.build(bs("a", "b", "c"))
    for _ in range(50):
        clock.now += 0.01
        res = picker.pick(INFO)
        assert not res.wants_trailers
        res.done(Outcome(OK, 0.001))
    for address in "abc":
        policy.on_probe_failed(address, True)
    for _ in range(50):
        clock.now += 0.01
        pick(picker)
    assert policy.probe_picks == 0
    with pytest.raises(InvalidServiceConfig, match="callReports: expected true or false"):
        prequal.PrequalPolicy.parse_config({"callReports": "yes"}, "lb")
