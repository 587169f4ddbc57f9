"""weighted_random: random choice proportional to registration weights (0 drains); seeded rngs, and one channel
against real gRPC servers registered with weights in an in-process registry."""

from __future__ import annotations

import itertools
import logging
import os
import random
from collections import Counter

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from waypost.balancer.base import PickError, PickInfo
from waypost.balancer.policies import get_policy
from waypost.balancer.weighted_random import alias_table
from waypost.errors import InvalidServiceConfig, NoBackendAvailable
from waypost.types import Backend

_n = itertools.count()


def weighted(**weights: object) -> list[Backend]:
    return [Backend(a, {} if w is None else {"weight": w}) for a, w in weights.items()]


def make(seed: int = 1):
    return get_policy("weighted_random")(rng=random.Random(seed))


def counts(picker, n: int) -> Counter[str]:
    return Counter(picker.pick(PickInfo()).backend.address for _ in range(n))


@pytest.mark.parametrize("weights", [[1], [1, 1], [10, 20, 30], [1, 1000], [3, 1, 4, 1, 5, 9, 2, 6]])
def test_alias_table_gives_each_column_its_exact_weight(weights):
    prob, alias = alias_table(weights)
    n, total = len(weights), sum(weights)
    mass = [0.0] * n
    for i in range(n):
        mass[i] += prob[i] / n
        mass[alias[i]] += (1.0 - prob[i]) / n
    assert mass == pytest.approx([w / total for w in weights])


def test_picks_are_proportional_to_weights_and_missing_is_100():
    picker = make().build(weighted(a=10, b="30", c=None, d=60.0))  # c: 100
    got = counts(picker, 20000)
    for addr, w in {"a": 10, "b": 30, "c": 100, "d": 60}.items():
        assert got[addr] / 20000 == pytest.approx(w / 200, abs=0.01), got


def test_same_seed_same_sequence_and_one_rng_draw_per_pick():
    seqs = []
    for _ in range(2):
        rng = random.Random(9)
        picker = get_policy("weighted_random")(rng=rng).build(weighted(a=1, b=2, c=3))
        seqs.append([picker.pick(PickInfo()).backend.address for _ in range(30)])
        ref = random.Random(9)
        for _ in range(30):
            ref.random()
        assert rng.random() == ref.random()
    assert seqs[0] == seqs[1] and set(seqs[0]) == {"a", "b", "c"}


def test_drained_is_never_picked_and_all_drained_fails_with_the_wrr_text():
    policy = make()
    assert set(counts(policy.build(weighted(a=0, b=5, c=-3)), 500)) == {"b"}  # negative: drained too
    with pytest.raises(PickError) as ei:
        policy.build(weighted(a=0, b="0")).pick(PickInfo())
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert ei.value.message.startswith("weighted_random: every backend has weight 0 (all 2 READY backends are "
                                       "drained); register a backend with a positive metadata weight")
    with pytest.raises(NoBackendAvailable):
        policy.build([]).pick(PickInfo())


def test_a_bad_weight_is_logged_once_and_counts_as_100(caplog):
    policy = make()
    with caplog.at_level(logging.WARNING, logger="waypost.balancer.weighted_random"):
        for _ in range(3):
            picker = policy.build(weighted(a="heavy", b=100))
    assert len([r for r in caplog.records if "heavy" in r.getMessage()]) == 1
    assert policy.weights() == {"a": 100, "b": 100}
    got = counts(picker, 4000)
    assert got["a"] / 4000 == pytest.approx(0.5, abs=0.04)
    policy.build(weighted(a=7, b=100))  # re-registered with another weight
    assert policy.weights()["a"] == 7


def test_takes_no_fields():
    assert get_policy("weighted_random").parse_config({}, "p") == {}
    with pytest.raises(InvalidServiceConfig, match=r"^p\.weight: unknown field for weighted_random"):
        get_policy("weighted_random").parse_config({"weight": 1}, "p")


def test_real_channel_follows_registered_weights():
    name = f"wrand{os.getpid()}x{next(_n)}"
    registry = waypost.connect(f"memory://{name}")
    with echo_servers("drained", "light", "heavy") as (drained, light, heavy):
        pubs = [waypost.Publisher(registry, "w.rpc", drained.address, metadata={"weight": 0}),
                waypost.Publisher(registry, "w.rpc", light.address, metadata={"weight": "10"}),
                waypost.Publisher(registry, "w.rpc", heavy.address, metadata={"weight": 40})]
        for p in pubs:
            p.start()
        try:
            with waypost.dial(f"memory://{name}/?key=w.rpc", balancer="weighted_random") as ch:
                assert ch.balancer.policy.name == "weighted_random"
                stub = echo_pb2_grpc.EchoStub(ch)
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 3, 30, what="three READY backends")
                got = Counter(stub.Unary(echo_pb2.EchoRequest(), timeout=20).server for _ in range(100))
                # 1:4 (P(light >= heavy) over 100 calls is below 1e-9)
                assert set(got) <= {"light", "heavy"} and got["heavy"] > got["light"] > 0, got
        finally:
            for p in pubs:
                p.stop()
