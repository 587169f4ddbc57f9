"""consistent_hash: go-zero's ring (golden values), stickiness, minimal movement; hash_key()."""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections import Counter

import grpc
import mmh3
import pytest

from tests.balancer.support import bs
from waypost.balancer.base import PickError, PickInfo, key_bytes, normalize_hash_key
from waypost.balancer.consistent_hash import MISSING_KEY_MESSAGE, REPLICAS, HashRing, hash64
from waypost.balancer.policies import get_policy
from waypost.client.hashkey import current_hash_key, hash_key
from waypost.errors import InvalidServiceConfig
from waypost.types import Backend

ADDRS = [f"10.0.0.{i}:8080" for i in range(1, 6)]


def test_hash_golden_values():
    assert hash64(b"hello") == 0xCBD8A7B341BD9B02
    assert hash64(b"") == 0
    # the unsigned view of mmh3's signed first 64 bits
    signed = mmh3.hash64(b"10.0.0.1:80800", seed=0, x64arch=True)[0]
    assert hash64(b"10.0.0.1:80800") == signed % 2**64


def reference_owner(addrs, key: str) -> str:
    """An independent straight-line version of go-zero's ring lookup."""
    points = sorted((hash64(f"{a}{i}".encode()), a) for a in addrs for i in range(100))
    hashes = [h for h, _ in points]
    i = bisect.bisect_left(hashes, hash64(key.encode())) % len(points)
    return points[i][1]


def test_ring_matches_reference_lookup():
    ring = HashRing(ADDRS)
    assert len(ring) == REPLICAS * len(ADDRS) == 500
    for k in range(2000):
        key = f"user-{k}"
        assert ring.get(key) == reference_owner(ADDRS, key)


def test_ring_golden_assignments_from_go_zero():
    """Produced by go-zero v1.10.3 core/hash.NewConsistentHash() with Add("10.0.0.1:8080".."10.0.0.5:8080")
    and Get(key) (a throwaway Go program; 5000 keys "user-N" agreed as well)."""
    ring = HashRing(ADDRS)
    go_zero = {
        "hello": "10.0.0.5:8080",
        "user-1": "10.0.0.1:8080",
        "user-2": "10.0.0.3:8080",
        "42": "10.0.0.2:8080",
        "session-7": "10.0.0.4:8080",
    }
    assert {key: ring.get(key) for key in go_zero} == go_zero


def test_sticky_and_wraps():
    policy = get_policy("consistent_hash")()
    picker = policy.build(bs(ADDRS))
    for k in range(200):
        first = picker.pick(PickInfo(hash_key=f"k{k}")).backend.address
        assert all(picker.pick(PickInfo(hash_key=f"k{k}")).backend.address == first for _ in range(3))
    # a key hashing past the last point wraps to the first point
    ring = HashRing(ADDRS)
    top = max(hash64(f"{a}{i}".encode()) for a in ADDRS for i in range(100))
    bottom_owner = min((hash64(f"{a}{i}".encode()), a) for a in ADDRS for i in range(100))[1]
    for k in range(100_000):
        if hash64(f"w{k}".encode()) > top:
            assert ring.get(f"w{k}") == bottom_owner
            break
    else:
        pytest.fail("no key above the top ring point in 100k tries")


def test_spread_is_reasonable():
    picker = get_policy("consistent_hash")().build(bs(ADDRS))
    counts = Counter(picker.pick(PickInfo(hash_key=f"user-{k}")).backend.address for k in range(10_000))
    assert set(counts) == set(ADDRS)
    assert min(counts.values()) > 1000  # 2000 each on average; 100 vnodes keep it within ~2x


def test_minimal_movement_on_add_and_remove():
    keys = [f"session-{k}" for k in range(5000)]
    policy = get_policy("consistent_hash")()
    before = {k: policy.build(bs(ADDRS)).pick(PickInfo(hash_key=k)).backend.address for k in keys}
    six = [*ADDRS, "10.0.0.6:8080"]
    picker = policy.build(bs(six))
    after = {k: picker.pick(PickInfo(hash_key=k)).backend.address for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "10.0.0.6:8080" for k in moved)  # keys only move to the new address
    # The ring is a pure function of the addresses (murmur3, no seed): the count is exact, ~1/6 of 5000.
    assert len(moved) == 741
    four = ADDRS[:-1]
    picker = policy.build(bs(four))
    removed = {k: picker.pick(PickInfo(hash_key=k)).backend.address for k in keys}
    moved = [k for k in keys if before[k] != removed[k]]
    assert {before[k] for k in moved} == {ADDRS[-1]}  # only the removed address's keys move...
    assert len(moved) == sum(before[k] == ADDRS[-1] for k in keys) == 1000  # ...all of them (exactly 1/5 here)


def test_ring_rebuilt_only_when_address_set_changes():
    policy = get_policy("consistent_hash")()
    policy.build(bs(ADDRS))
    ring = policy._ring
    policy.build(bs(reversed(ADDRS)))
    policy.build([Backend(a, {"weight": 5}) for a in ADDRS])
    assert policy._ring is ring
    policy.build(bs(ADDRS[:3]))
    assert policy._ring is not ring


def test_missing_key_is_invalid_argument():
    picker = get_policy("consistent_hash")().build(bs(ADDRS))
    for info in (PickInfo(), PickInfo(hash_key=""), PickInfo(metadata=(("x-user", "u1"),))):
        with pytest.raises(PickError) as ei:
            picker.pick(info)
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert ei.value.message == MISSING_KEY_MESSAGE == "[consistent_hash] missing hash key in context"


def test_key_from_header():
    cfg = get_policy("consistent_hash").parse_config({"hashHeader": "X-User"}, "lb[0].consistent_hash")
    picker = get_policy("consistent_hash")(cfg).build(bs(ADDRS))
    by_header = picker.pick(PickInfo(metadata=(("other", "z"), ("x-user", "u1")))).backend.address
    assert by_header == picker.pick(PickInfo(hash_key="u1")).backend.address
    assert by_header == picker.pick(PickInfo(metadata=(("x-user", b"u1"),))).backend.address
    # an explicit hash_key wins over the header
    hello = HashRing(ADDRS).get("hello")
    assert hello != by_header
    assert picker.pick(PickInfo(hash_key="hello", metadata=(("x-user", "u1"),))).backend.address == hello


@pytest.mark.parametrize("bad", ["", 3, ":path", " x", None])
def test_hash_header_validation(bad):
    with pytest.raises(InvalidServiceConfig, match=r"lb\[0\]\.consistent_hash\.hashHeader"):
        get_policy("consistent_hash").parse_config({"hashHeader": bad}, "lb[0].consistent_hash")


def test_hash_key_normalisation():
    assert normalize_hash_key("abc") == "abc"
    assert normalize_hash_key(42) == "42"
    raw = b"\xff\x00user"
    assert key_bytes(normalize_hash_key(raw)) == raw  # bytes hash as the very same bytes
    ring = HashRing(ADDRS)
    assert ring.get(normalize_hash_key(b"hello")) == ring.get("hello")
    with pytest.raises(TypeError):
        normalize_hash_key(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        normalize_hash_key(True)


def test_hash_key_context_nesting_threads_and_tasks():
    assert current_hash_key() is None
    with hash_key("outer"):
        assert current_hash_key() == "outer"
        with hash_key(7):
            assert current_hash_key() == "7"
        assert current_hash_key() == "outer"
        seen = []
        t = threading.Thread(target=lambda: seen.append(current_hash_key()))
        t.start()
        t.join()
        assert seen == [None]  # a thread starts with its own context
    assert current_hash_key() is None

    async def task(key: str) -> str | None:
        with hash_key(key):
            await asyncio.sleep(0)
            return current_hash_key()

    async def main() -> list[str | None]:
        return await asyncio.gather(*(task(f"t{i}") for i in range(5)))

    assert asyncio.run(main()) == [f"t{i}" for i in range(5)]


# ---- the weighted ring (off by default) --------------------------------------------------------------------


def owners(policy, backends, n: int = 6000) -> dict[str, str]:
    picker = policy.build(backends)
    return {f"user-{k}": picker.pick(PickInfo(hash_key=f"user-{k}")).backend.address for k in range(n)}


def weighted_policy():
    cls = get_policy("consistent_hash")
    return cls(cls.parse_config({"weighted": True}, "p"))


def test_weighted_ring_without_weights_is_go_zeros_ring():
    plain = owners(get_policy("consistent_hash")(), bs(ADDRS))
    assert owners(weighted_policy(), bs(ADDRS)) == plain
    assert owners(weighted_policy(), [Backend(a, {"weight": 100}) for a in ADDRS]) == plain
    assert get_policy("consistent_hash")().weighted is False


def test_weighted_ring_gives_virtual_nodes_in_proportion_to_weight():
    ring = HashRing(ADDRS, replicas_of={ADDRS[0]: 300, ADDRS[1]: 0})
    assert len(ring) == 300 + 0 + 3 * REPLICAS
    backends = [Backend(ADDRS[0], {"weight": "300"}), *bs(ADDRS[2:])]
    got = Counter(owners(weighted_policy(), backends).values())
    share = got[ADDRS[0]] / sum(got.values())
    assert share == pytest.approx(0.5, abs=0.08), got  # 300 of 600 points


def test_raising_a_weight_moves_keys_only_to_that_address():
    policy = weighted_policy()
    before = owners(policy, bs(ADDRS))
    after = owners(policy, [Backend(ADDRS[0], {"weight": 150}), *bs(ADDRS[1:])])
    moved = {k for k in before if before[k] != after[k]}
    assert moved and {after[k] for k in moved} == {ADDRS[0]}
    assert len(moved) / len(before) == pytest.approx(50 / 550, abs=0.05)


def test_weighted_ring_drains_weight_zero_and_fails_when_all_are_drained():
    policy = weighted_policy()
    got = owners(policy, [Backend(ADDRS[0], {"weight": 0}), *bs(ADDRS[1:])])
    assert ADDRS[0] not in got.values()
    with pytest.raises(PickError) as ei:
        policy.build([Backend(a, {"weight": 0}) for a in ADDRS[:2]]).pick(PickInfo(hash_key="k"))
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert ei.value.message.startswith("consistent_hash: every backend has weight 0 (all 2 READY backends")
    with pytest.raises(PickError) as ei:  # the key is still checked first, as go-zero does
        policy.build([Backend(ADDRS[0], {"weight": 0})]).pick(PickInfo())
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_weighted_ring_caps_virtual_nodes_and_logs_a_bad_weight_once(caplog):
    from waypost.balancer.consistent_hash import MAX_WEIGHTED_REPLICAS

    policy = weighted_policy()
    with caplog.at_level("WARNING", logger="waypost.balancer.consistent_hash"):
        for _ in range(3):
            policy.build([Backend(ADDRS[0], {"weight": "heavy"}), Backend(ADDRS[1], {"weight": 10**9})])
    assert len([r for r in caplog.records if "heavy" in r.getMessage()]) == 1
    assert len(policy._ring) == REPLICAS + MAX_WEIGHTED_REPLICAS


@pytest.mark.parametrize("value", ["yes", 1, None, {}])
def test_weighted_must_be_a_bool(value):
    with pytest.raises(InvalidServiceConfig, match=r"^p\.weighted: expected true or false"):
        get_policy("consistent_hash").parse_config({"weighted": value}, "p")
