"""LoadAccount, CpuMeter and set_load with injected clocks: deterministic, no servers."""

from __future__ import annotations

import logging
import math

import pytest

from tests.balancer.support import FakeClock
from waypost.orca import account as acc
from waypost.orca.account import (
    FRESH_WINDOW,
    CpuMeter,
    LoadAccount,
    application_value,
    bucket_of,
    set_load,
)


def run_call(a: LoadAccount, clock: FakeClock, latency: float, failed: bool = False) -> None:
    token = a.begin()
    clock.now += latency
    a.end(token, failed)


@pytest.fixture(autouse=True)
def _no_app_value():
    set_load(None)
    yield
    set_load(None)


def test_buckets_are_logarithmic():
    assert [bucket_of(r) for r in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 2, 2, 3, 3, 4]
    assert bucket_of(10**9) == acc.BUCKETS - 1


def test_in_flight_counts_every_open_call_and_failures():
    clock = FakeClock(100.0)
    a = LoadAccount(clock)
    tokens = [a.begin() for _ in range(3)]
    assert a.snapshot().in_flight == 3
    assert [t[0] for t in tokens] == [0, 1, 2]  # each call's RIF: the calls already in flight
    a.end(tokens[0])
    a.end(tokens[1], failed=True)
    snap = a.snapshot()
    assert (snap.in_flight, snap.calls_completed, snap.calls_failed) == (1, 2, 1)


def test_no_estimate_before_any_call_ended():
    a = LoadAccount(FakeClock(100.0))
    a.begin()
    assert a.snapshot().latency_estimate is None


def test_estimate_is_the_ewma_of_the_current_buckets_calls():
    clock = FakeClock(100.0)
    a = LoadAccount(clock)
    run_call(a, clock, 0.010)  # RIF 0: first sample taken as is
    assert a.latency_estimate() == pytest.approx(0.010)
    run_call(a, clock, 0.090)
    assert a.latency_estimate() == pytest.approx(0.010 + acc.ALPHA * 0.080)


def test_estimate_from_a_lower_bucket_is_scaled_by_the_load():
    clock = FakeClock(100.0)
    a = LoadAccount(clock)
    run_call(a, clock, 0.010)  # only RIF 0 known
    assert a.latency_estimate(rif=3) == pytest.approx(0.010 * 4 / 1)


def test_estimate_from_a_higher_bucket_is_taken_as_is():
    clock = FakeClock(100.0)
    a = LoadAccount(clock)
    held = [a.begin() for _ in range(4)]  # RIF 0..3
    token = a.begin()  # RIF 4: bucket 3
    clock.now += 0.050
    a.end(token)
    assert a.latency_estimate(rif=0) == pytest.approx(0.050)
    for t in held:  # these end at the same instant: RIF 0..3 samples of ~0.05 s
        a.end(t)


def test_stale_buckets_yield_to_fresh_ones_and_are_used_when_nothing_is_fresh():
    clock = FakeClock(100.0)
    a = LoadAccount(clock)
    run_call(a, clock, 0.200)  # RIF 0 sample
    clock.now += FRESH_WINDOW + 1  # now stale
    held = a.begin()
    run_call(a, clock, 0.030)  # RIF 1 sample, fresh
    assert a.latency_estimate(rif=0) == pytest.approx(0.030)  # the fresh higher bucket, as is
    clock.now += FRESH_WINDOW + 1  # everything stale: the most recently updated bucket answers
    assert a.latency_estimate(rif=0) == pytest.approx(0.030)
    assert a.latency_estimate(rif=7) == pytest.approx(0.030 * 8 / 2)  # from RIF 1, scaled up
    a.end(held)


def test_cpu_meter_measures_between_readings():
    wall, cpu = FakeClock(0.0), FakeClock(0.0)
    m = CpuMeter(wall, cpu)
    m._cores = 2
    assert m.read() is None  # too early
    wall.now, cpu.now = 1.0, 0.5
    assert m.read() == pytest.approx(0.25)  # 0.5 CPU-s per s over 2 cores
    wall.now, cpu.now = 1.1, 0.6  # under CPU_INTERVAL: the last value
    assert m.read() == pytest.approx(0.25)
    wall.now, cpu.now = 2.0, 10.0
    assert m.read() == 1.0  # clamped


def test_set_load_value_callable_and_none():
    set_load(3)
    assert application_value() == 3.0
    set_load(lambda: 0.5)
    assert application_value() == 0.5
    set_load(None)
    assert application_value() is None


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan])
def test_set_load_rejects_bad_numbers(bad):
    with pytest.raises(ValueError, match="finite number >= 0"):
        set_load(bad)


@pytest.mark.parametrize("bad", ["3", True, [1]])
def test_set_load_rejects_non_numbers(bad):
    with pytest.raises(TypeError, match="a number >= 0, a callable or None"):
        set_load(bad)


def test_a_failing_callback_is_logged_once_and_reported_as_absent(caplog):
    def broken() -> float:
        raise RuntimeError("queue gone")

    set_load(broken)
    with caplog.at_level(logging.WARNING, logger="waypost.orca"):
        assert application_value() is None
        assert application_value() is None
    assert [r.getMessage() for r in caplog.records if "queue gone" in r.getMessage()] != []
    assert len([r for r in caplog.records if "queue gone" in r.getMessage()]) == 1
    set_load(lambda: -2.0)  # a bad value from a callback: absent, not an error
    assert application_value() is None
