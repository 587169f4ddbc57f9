"""The metadata filter runs once per resolver list: in the subsetter where the resolver subsets, else in the
balancer (``Routing.admit``); either way the list the policy sees and the "none matches" note are the same."""

from __future__ import annotations

from waypost.client.routing import FilteringSubsetter, Routing
from waypost.types import Backend


class _CountingRouting(Routing):
    """A Routing that counts how many backends its filter looked at."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.looked_at = 0

    def keep(self, backends):
        self.looked_at += len(backends)
        return super().keep(backends)


def _backends() -> list[Backend]:
    return [Backend("10.0.0.1:1", {"g": "canary"}), Backend("10.0.0.2:1", {"g": "stable"}),
            Backend("10.0.0.3:1", {"g": "canary"})]


def test_a_subsetting_resolver_filters_and_the_balancer_does_not_again():
    routing = _CountingRouting({"g": "canary"}, None, 1)
    subset = FilteringSubsetter(routing, 10).select(_backends())  # what the resolver hands the channel
    assert [b.address for b in subset] == ["10.0.0.1:1", "10.0.0.3:1"]
    kept, note = routing.admit(subset)
    assert kept == subset and note is None
    assert routing.looked_at == 3  # each backend once


def test_without_a_subsetter_the_balancer_filters():
    routing = _CountingRouting({"g": "canary"}, None, 1)
    kept, note = routing.admit(_backends())  # e.g. a direct target: its resolver does not subset
    assert [b.address for b in kept] == ["10.0.0.1:1", "10.0.0.3:1"] and note is None
    assert routing.looked_at == 3


def test_the_note_counts_what_the_filter_dropped_on_either_path():
    for upstream in (True, False):
        routing = Routing({"g": "blue"}, None, 1)
        backends = _backends()
        if upstream:
            backends = FilteringSubsetter(routing, 10).select(backends)
        kept, note = routing.admit(backends)
        assert kept == []
        assert note == "resolver returned no backends matching metadata_filter={'g': 'blue'} (3 resolved, none matches)"


def test_no_filter_passes_the_list_as_it_is():
    routing = Routing(None, {"g": "canary"}, 1)
    assert routing.admit(_backends()) == (_backends(), None)
