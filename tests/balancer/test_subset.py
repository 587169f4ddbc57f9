"""Subsetting: stable (rendezvous) by default, deterministic (SRE book) with a client id."""

from __future__ import annotations

import collections

import pytest

from waypost.resolver.subset import DEFAULT_SUBSET_SIZE, Subsetter, deterministic_subset
from waypost.types import Backend


def _backends(n: int, start: int = 0) -> list[Backend]:
    return [Backend(f"10.0.{i // 250}.{i % 250}:8080") for i in range(start, start + n)]


def _addrs(bs) -> set[str]:
    return {b.address for b in bs}


def test_small_sets_are_kept_whole_and_in_order():
    bs = _backends(10)
    assert Subsetter(seed=1).select(bs) == bs
    assert DEFAULT_SUBSET_SIZE == 32


def test_stable_subset_size_and_order():
    bs = _backends(100)
    got = Subsetter(seed=7).select(bs)
    assert len(got) == 32
    assert got == [b for b in bs if b in got]  # input order kept


def test_stable_join_changes_at_most_one_slot():
    s = Subsetter(seed=42)
    bs = _backends(100)
    before = _addrs(s.select(bs))
    for extra in range(100, 130):
        bs2 = [*bs, *_backends(1, extra)]
        after = _addrs(s.select(bs2))
        assert len(after) == 32
        assert len(before - after) <= 1 and len(after - before) <= 1
        if after != before:  # the newcomer replaced exactly one member
            assert after - before == {f"10.0.{extra // 250}.{extra % 250}:8080"}


def test_stable_leave_changes_only_the_affected_slot():
    s = Subsetter(seed=3)
    bs = _backends(100)
    before = _addrs(s.select(bs))
    for victim in bs[:40]:
        rest = [b for b in bs if b != victim]
        after = _addrs(s.select(rest))
        if victim.address in before:
            assert before - after == {victim.address} and len(after - before) == 1
        else:
            assert after == before


def test_stable_subsets_spread_clients_roughly_evenly():
    bs = _backends(64)
    load = collections.Counter()
    for seed in range(400):
        load.update(_addrs(Subsetter(seed=seed).select(bs)))
    # each of 400 clients picks 32 of 64 backends: 200 expected per backend
    assert len(load) == 64
    assert min(load.values()) > 140 and max(load.values()) < 260


def test_deterministic_subsets_cover_backends_evenly():
    addrs = [b.address for b in _backends(96)]
    size = 16
    load = collections.Counter()
    clients = 60  # 10 rounds of 6 subsets
    for cid in range(clients):
        sub = deterministic_subset(addrs, cid, size)
        assert len(sub) == size and len(set(sub)) == size
        load.update(sub)
    # every backend is used by exactly clients * size / backends clients
    assert set(load.values()) == {clients * size // 96}


def test_deterministic_mode_through_subsetter_is_reproducible():
    bs = _backends(50)
    a = Subsetter(10, client_id=3, seed=1).select(bs)
    b = Subsetter(10, client_id="3", seed=999).select(list(reversed(bs)))
    assert _addrs(a) == _addrs(b) and len(a) == 10
    # the clients of one round partition the backends
    round_ = [_addrs(Subsetter(10, client_id=c).select(bs)) for c in range(5)]
    assert set().union(*round_) == _addrs(bs) and sum(len(r) for r in round_) == 50


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_size_rejected(bad):
    with pytest.raises(ValueError, match="subset size"):
        Subsetter(bad)


@pytest.mark.parametrize("bad", [-1, "abc", "1.5"])
def test_bad_client_id_rejected(bad):
    with pytest.raises(ValueError, match="client_id"):
        Subsetter(4, client_id=bad)
