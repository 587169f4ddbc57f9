"""pick_first, round_robin, random and the policy registry: exact sequences with a seeded rng."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from waypost.balancer.base import Outcome, PickInfo, Policy
from waypost.balancer.policies import POLICIES, get_policy, known_policies, register_policy
from waypost.errors import InvalidServiceConfig, NoBackendAvailable
from waypost.types import Backend

ALL = [
    "consistent_hash",
    "least_request",
    "outlier_detection",
    "p2c_ewma",
    "peak_ewma",
    "pick_first",
    "prequal",
    "random",
    "round_robin",
    "smooth_weighted_round_robin",
    "weighted_random",
    "weighted_round_robin",
]


def backends(*addrs: str) -> list[Backend]:
    return [Backend(a) for a in addrs]


def picks(picker, n: int, info: PickInfo | None = None) -> list[str]:
    out = []
    for _ in range(n):
        res = picker.pick(info or PickInfo(method="/s/M", hash_key="k"))
        res.done(Outcome())
        out.append(res.backend.address)
    return out


def test_registry_knows_every_policy():
    assert known_policies() == ALL
    for name in ALL:
        assert get_policy(name).name == name
    assert register_policy is not None and POLICIES["round_robin"] is get_policy("round_robin")
    with pytest.raises(KeyError):
        get_policy("p2c")


@pytest.mark.parametrize("name", ALL)
def test_empty_backend_list_raises_no_backend(name):
    picker = get_policy(name)({}, rng=random.Random(1)).build([])
    with pytest.raises(NoBackendAvailable):
        picker.pick(PickInfo(hash_key="k"))


def test_pick_first_takes_first_in_resolver_order():
    policy = get_policy("pick_first")()
    assert picks(policy.build(backends("a:1", "b:1", "c:1")), 3) == ["a:1"] * 3
    # the channel rebuilds with READY backends only: a:1 not READY -> b:1
    assert picks(policy.build(backends("b:1", "c:1")), 2) == ["b:1"] * 2


def test_pick_first_is_sticky_while_its_backend_stays_ready():
    policy = get_policy("pick_first")()
    assert picks(policy.build(backends("b:1")), 2) == ["b:1"] * 2  # b connected first
    assert picks(policy.build(backends("a:1", "b:1")), 2) == ["b:1"] * 2  # a READY later: no switch
    assert picks(policy.build(backends("a:1", "c:1")), 2) == ["a:1"] * 2  # b gone: first in order
    assert picks(policy.build(backends("a:1", "b:1", "c:1")), 2) == ["a:1"] * 2


def test_pick_first_shuffle_is_stable_across_rebuilds():
    addrs = [f"10.0.0.{i}:80" for i in range(8)]
    policy = get_policy("pick_first")({"shuffleAddressList": True}, rng=random.Random(3))
    order = policy.order(backends(*addrs))
    assert sorted(b.address for b in order) == addrs
    assert [b.address for b in order] != addrs  # seed 3 does shuffle 8 addresses
    # same set in another resolver order -> same order
    assert policy.order(backends(*reversed(addrs))) == order
    # a new address lands somewhere; the others keep their relative order
    grown = policy.order(backends(*addrs, "10.0.0.99:80"))
    assert [b for b in grown if b.address != "10.0.0.99:80"] == order
    first = order[0].address
    assert picks(policy.build(backends(*addrs)), 2) == [first, first]


def test_pick_first_shuffle_spreads_clients():
    addrs = [f"10.0.0.{i}:80" for i in range(4)]
    firsts = Counter(
        get_policy("pick_first")({"shuffleAddressList": True}, rng=random.Random(seed))
        .build(backends(*addrs)).pick(PickInfo()).backend.address
        for seed in range(400)
    )
    assert set(firsts) == set(addrs)
    assert min(firsts.values()) > 50


def test_pick_first_config_validation():
    cls = get_policy("pick_first")
    assert cls.parse_config(None, "lb[0].pick_first") == {}
    assert cls.parse_config({"shuffleAddressList": True}, "p") == {"shuffleAddressList": True}
    with pytest.raises(InvalidServiceConfig, match=r"lb\[0\]\.pick_first\.shuffleAddressList"):
        cls.parse_config({"shuffleAddressList": "yes"}, "lb[0].pick_first")
    with pytest.raises(InvalidServiceConfig, match=r"p\.shuffle: unknown field"):
        cls.parse_config({"shuffle": True}, "p")
    with pytest.raises(InvalidServiceConfig, match="expected a JSON object"):
        cls.parse_config([1], "p")


def test_round_robin_starts_at_random_index_then_rotates():
    addrs = ["a:1", "b:1", "c:1"]
    for seed in range(5):
        start = random.Random(seed).randrange(3)
        picker = get_policy("round_robin")(rng=random.Random(seed)).build(backends(*addrs))
        assert picks(picker, 7) == [addrs[(start + i) % 3] for i in range(7)]


def test_round_robin_exact_sequence_seed_0():
    picker = get_policy("round_robin")(rng=random.Random(0)).build(backends("a:1", "b:1", "c:1"))
    # random.Random(0).randrange(3) == 1
    assert picks(picker, 5) == ["b:1", "c:1", "a:1", "b:1", "c:1"]


def test_random_follows_the_rng():
    addrs = ["a:1", "b:1", "c:1", "d:1"]
    picker = get_policy("random")(rng=random.Random(42)).build(backends(*addrs))
    ref = random.Random(42)
    assert picks(picker, 50) == [addrs[ref.randrange(4)] for _ in range(50)]
    counts = Counter(picks(picker, 4000))
    assert set(counts) == set(addrs) and min(counts.values()) > 800


def test_duplicate_addresses_are_collapsed():
    picker = get_policy("round_robin")(rng=random.Random(0)).build(backends("a:1", "a:1", "b:1"))
    assert sorted(set(picks(picker, 4))) == ["a:1", "b:1"]
    assert Counter(picks(picker, 4)) == {"a:1": 2, "b:1": 2}


@pytest.mark.parametrize("name", ALL)
def test_thread_safety_smoke(name):
    """8 threads x 10k picks: no exception, every pick counted once, in-flight back to 0."""
    addrs = [f"10.0.0.{i}:80" for i in range(5)]
    policy = get_policy(name)(rng=random.Random(9))
    picker = policy.build(backends(*addrs))
    counts: list[Counter] = []
    errors: list[BaseException] = []

    def work() -> None:
        c: Counter = Counter()
        try:
            for i in range(10_000):
                res = picker.pick(PickInfo(hash_key=f"user-{i}"))
                c[res.backend.address] += 1
                res.done(Outcome(latency=0.001))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        counts.append(c)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    total = sum(counts, Counter())
    assert sum(total.values()) == 80_000
    assert set(total) <= set(addrs)
    if name in ("round_robin", "smooth_weighted_round_robin"):
        assert set(total.values()) == {16_000}  # atomic counter / locked SWRR: exactly even
    if name == "p2c_ewma":
        assert all(s["inflight"] == 0 for s in policy.snapshot().values())
    if name == "least_request":
        assert set(policy.inflight().values()) == {0}
    if name == "consistent_hash":
        assert len(total) == 5  # 10k keys spread over every address
    if name == "pick_first":
        assert total == {addrs[0]: 80_000}


def test_register_policy_checks_what_it_is_given():
    class NotAPolicy:
        name = "my_thing"

    with pytest.raises(TypeError, match="subclass of waypost.Policy"):
        register_policy(NotAPolicy)  # type: ignore[type-var]

    class Nameless(Policy):
        def build(self, backends):  # pragma: no cover - never built
            raise AssertionError

    with pytest.raises(ValueError, match="needs a class attribute `name`"):
        register_policy(Nameless)

    class Impostor(Nameless):
        name = "round_robin"

    with pytest.raises(ValueError, match="'round_robin' is a built-in policy.*my_round_robin"):
        register_policy(Impostor)
    assert POLICIES["round_robin"] is get_policy("round_robin") is not Impostor

    @register_policy
    class Mine(Nameless):
        name = "test_register_mine"

    try:
        assert POLICIES["test_register_mine"] is Mine and register_policy(Mine) is Mine  # again: no change
    finally:
        del POLICIES["test_register_mine"]
