"""Routing by registration metadata: ``dial(metadata_filter=..., prefer=..., min_preferred=...)``.

- ``metadata_filter``: only backends whose metadata matches are used at all. Applied once to each resolver
  list: before subsetting where the resolver subsets (``FilteringSubsetter``; a filter after subsetting would
  keep a fraction of a small group), else by the balancer as the list arrives (``Routing.admit``), always
  before any connection is made, so the policy never sees the others. No match: calls fail UNAVAILABLE
  naming the filter.
- ``prefer`` + ``min_preferred``: of the (kept) READY backends, the policy's picker is built from the
  matching ones while at least ``min_preferred`` of them are READY; below that it is built from all of them
  (spill). Each switch is logged once at INFO. The other backends stay connected (with every policy but
  pick_first, which holds one connection), so a spill is instant.

A match: every key of the spec is in the backend's metadata with an allowed value; a value is one allowed
value or a list/tuple/set of them, compared as text (``{"weight": 5}`` matches a registered ``"5"``; true and
false as JSON spells them). Nothing here runs per call: only on resolver updates and picker rebuilds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ..resolver import Subsetter
from ..types import Backend
from .subconn import SubConn

log = logging.getLogger("waypost.client")


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class MetadataMatch:
    """A validated ``{key: value-or-values}`` spec; ``what`` names the dial argument in errors and logs."""

    __slots__ = ("_items", "spec", "what")

    def __init__(self, spec: object, what: str) -> None:
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError(f"dial: {what} must be a non-empty mapping of metadata key -> value "
                             f"(e.g. {{'zone': 'us-east-1a'}}), got {spec!r}")
        items = []
        for key, value in spec.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"dial: {what} keys must be non-empty strings, got {key!r}")
            values = value if isinstance(value, (list, tuple, set, frozenset)) else (value,)
            if not values or any(v is None or isinstance(v, (Mapping, list, tuple, set, frozenset))
                                 for v in values):
                raise ValueError(f"dial: {what}[{key!r}] must be a value or a non-empty list of values "
                                 f"(strings, numbers, booleans), got {value!r}")
            items.append((key, frozenset(_text(v) for v in values)))
        self._items = tuple(items)
        self.spec = dict(spec)
        self.what = what

    def matches(self, backend: Backend) -> bool:
        md = backend.metadata
        for key, allowed in self._items:
            if key not in md or _text(md[key]) not in allowed:
                return False
        return True

    def describe(self) -> str:
        return f"{self.what}={self.spec!r}"


class Routing:
    """One channel's metadata filter and locality preference (None parts: not in use)."""

    def __init__(self, metadata_filter: Mapping[str, object] | None, prefer: Mapping[str, object] | None,
                 min_preferred: int, target: str = "") -> None:
        self.filter = MetadataMatch(metadata_filter, "metadata_filter") if metadata_filter is not None else None
        self.prefer = MetadataMatch(prefer, "prefer") if prefer is not None else None
        if isinstance(min_preferred, bool) or not isinstance(min_preferred, int) or min_preferred < 1:
            raise ValueError(f"dial: min_preferred must be an integer >= 1, got {min_preferred!r}")
        self.min_preferred = min_preferred
        self.target = target
        self.spilling: bool | None = None  # None: not decided yet (no READY backend so far)
        # Set by the FilteringSubsetter on its first list: from then on every list of this channel's resolver
        # comes through it (a resolver that subsets does so on every update), already filtered.
        self.filtered_upstream = False
        self.upstream_resolved = 0  # how many backends the subsetter's latest list had before the filter

    @classmethod
    def make(cls, metadata_filter: Mapping[str, object] | None, prefer: Mapping[str, object] | None,
             min_preferred: int | None) -> Routing | None:
        """The routing of a dial, or None when no routing argument is given (nothing to do at all)."""
        if metadata_filter is None and prefer is None:
            if min_preferred is not None:
                raise ValueError("dial: min_preferred needs prefer= (the metadata of the preferred backends)")
            return None
        return cls(metadata_filter, prefer, 1 if min_preferred is None else min_preferred)

    # ---- the filter (resolver updates) ------------------------------------------------------------

    def keep(self, backends: Sequence[Backend]) -> list[Backend]:
        f = self.filter
        if f is None:
            return list(backends)
        return [b for b in backends if f.matches(b)]

    def admit(self, backends: Sequence[Backend]) -> tuple[list[Backend], str | None]:
        """The resolver's list as the balancer uses it (filtered, unless the subsetter did it already), and why
        it is empty when the filter kept nothing (None otherwise)."""
        if self.filter is None:
            return list(backends), None
        if self.filtered_upstream:
            kept, resolved = list(backends), self.upstream_resolved
        else:
            kept, resolved = self.keep(backends), len(backends)
        return kept, (self.none_kept(resolved) if not kept else None)

    def none_kept(self, resolved: int) -> str:
        """Why the backend list is empty, for error details (``resolved``: how many the filter dropped here)."""
        assert self.filter is not None
        extra = f" ({resolved} resolved, none matches)" if resolved else ""
        return f"resolver returned no backends matching {self.filter.describe()}{extra}"

    # ---- the preference (picker rebuilds) ---------------------------------------------------------

    def preferred(self, usable: dict[str, SubConn]) -> dict[str, SubConn]:
        """The READY backends the picker is built from: the preferred ones while enough of them are READY."""
        p = self.prefer
        if p is None or not usable:
            return usable
        chosen = {a: sc for a, sc in usable.items() if p.matches(sc.backend)}
        spill = len(chosen) < self.min_preferred
        if spill is not self.spilling:
            if spill:
                log.info("waypost: %s: %d backends matching %s are READY, fewer than min_preferred=%d: "
                         "spilling to all %d READY backends", self.target, len(chosen), p.describe(),
                         self.min_preferred, len(usable))
            elif self.spilling is not None:
                log.info("waypost: %s: %d backends matching %s are READY again (min_preferred=%d): "
                         "using only them", self.target, len(chosen), p.describe(), self.min_preferred)
            self.spilling = spill
        return usable if spill else chosen


class FilteringSubsetter(Subsetter):
    """The registry resolver's subsetter, applying the metadata filter first: a subset is chosen among the
    matching backends only (a filter after subsetting would keep a fraction of a small group)."""

    def __init__(self, routing: Routing, size: int, *, client_id: int | str | None = None,
                 seed: int | None = None) -> None:
        super().__init__(size, client_id=client_id, seed=seed)
        self.routing = routing

    def select(self, backends: Sequence[Backend]) -> list[Backend]:
        routing = self.routing
        routing.upstream_resolved = len(backends)
        routing.filtered_upstream = True
        return super().select(routing.keep(backends))
