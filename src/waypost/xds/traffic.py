"""An export's traffic policy: subsets of its instances, weighted splits between them, routes on headers or
methods with their timeouts, circuit breaking and fault injection: the export options ``subset_key``,
``subsets``, ``split``, ``routes``, ``max_requests`` and ``fault`` (docs/xds.md, "Traffic policy").

Every subset is a Cluster of its own, named ``NAME/KEY=VALUE`` (``NAME/KEY1=V1,KEY2=V2`` for several keys), with
the export's policy, outlier detection and circuit breaking, and a ClusterLoadAssignment of the instances it
selects. A ``=`` never appears in an export name, so a subset's cluster never collides with an export's.

A route's matchers (path, headers, runtime_fraction) are ``matching.py``'s; all of them must match.

**A route's timeout** is its ``max_stream_duration`` (gRFC A31): grpc-go and grpc-java end a call at it
(DEADLINE_EXCEEDED), or at the client's own deadline when that comes first. grpcio 1.85 (gRPC C-core) ends calls
about 1.06 s *before* it (measured for timeouts of 1.2 s to 4 s: 2 s ends a call at 0.94 s), so a route timeout of
about 1 s or less fails every grpcio call at once; a warning at load says so for such a timeout.

**A subset with no endpoint is left out of every split while it is empty** (one log line says so when it
empties and when it is back): gRPC fails every call it routes to an empty cluster, so a canary split of 95/5
whose canary has no instance would lose 5 % of the calls; left out, they go to the rest of the split. A route
whose subsets are all empty sends to the export's whole cluster ``NAME`` instead (a canary header then reaches
the stable instances rather than failing). Before its source first answers, a split is served as configured.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from ..durations import DurationError, parse_positive_duration
from ..types import Backend
from .errors import XdsConfigError
from .matching import parse_match
from .model import Export, Fault, Route, Split, Subset

log = logging.getLogger("waypost.xds")

#: a subset name or a value of ``subset_key``, and a metadata key: what a cluster name may carry
TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,62}")
_ROUTE_KEYS = ("service", "method", "prefix", "path", "safe_regex", "case_sensitive", "headers", "runtime_fraction",
               "subset", "split", "timeout", "fault", "max_requests")
_FAULT_KEYS = ("delay", "delay_percent", "abort", "abort_percent")
#: how much earlier than a route's timeout grpcio 1.85 ends a call (measured for 1.2 s to 4 s: module docstring)
GRPCIO_TIMEOUT_EARLY = 1.06
#: the largest split weight (gRPC sums them in a uint32)
MAX_WEIGHT = 1_000_000
MAX_REQUESTS = 2**32 - 1


def _fail(where: str, message: str) -> XdsConfigError:
    return XdsConfigError(f"{where}: {message}")


def _token(value: object, where: str, what: str) -> str:
    if not isinstance(value, str) or not TOKEN_RE.fullmatch(value):
        raise _fail(where, f"{what} must be letters, digits, '.', '-' or '_' (at most 63, starting with a letter "
                           f"or digit), got {str(value)[:80]!r}")
    return value


def _integer(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(where, f"expected an integer from {lo} to {hi}, got {str(value)[:80]!r}")
    return value


# ------------------------------------------------------------------ option parsers (exports._OPTION_PARSERS)

def parse_subset_key(value: object, where: str) -> str:
    return _token(value, where, "the metadata key")


def parse_subsets(value: object, where: str) -> tuple[Subset, ...]:
    """A list of subset_key values (or a comma list), or a table NAME -> {KEY: VALUE}."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if isinstance(value, Mapping):
        out = []
        for name, selector in value.items():
            here = f"{where}: {str(name)[:60]!r}"
            _token(name, where, "a subset name")
            if not isinstance(selector, Mapping) or not selector:
                raise _fail(here, "expected a table of metadata KEY = VALUE (at least one)")
            pairs = tuple(sorted((_token(k, here, "a metadata key"), _token(_scalar(v, here), here, "a value"))
                                 for k, v in selector.items()))
            out.append(Subset(name, pairs))
        return tuple(out)
    if not isinstance(value, (list, tuple)) or not value:
        raise _fail(where, "expected a list of values of subset_key, or a table of NAME = {KEY = VALUE}")
    names = [_token(v, where, "a subset value") for v in value]
    return tuple(Subset(v) for v in dict.fromkeys(names))


def _scalar(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(where, f"a metadata value must be a string or an integer, got {type(value).__name__}")
    return str(value)


def parse_split(value: object, where: str) -> Split:
    """``{v1 = 95, v2 = 5}`` (a table: integer weights; a target may be ``{weight = 5, max_requests = 10}``) or
    ``v1:95,v2:5`` (the command line's text)."""
    if isinstance(value, str):
        items: dict[str, Any] = {}
        for part in value.split(","):
            name, sep, weight = part.strip().partition(":")
            if not sep:
                raise _fail(where, f"expected SUBSET:WEIGHT,... (e.g. v1:95,v2:5), got {part[:60]!r}")
            if name in items:
                raise _fail(where, f"subset {name[:60]!r} given twice")
            items[name] = int(weight) if weight.strip().isdigit() else weight
        value = items
    if not isinstance(value, Mapping) or not value:
        raise _fail(where, "expected a table of SUBSET = WEIGHT (e.g. {v1 = 95, v2 = 5})")
    limits = []
    plain: dict[str, Any] = {}
    for k, w in value.items():
        if isinstance(w, Mapping):  # a target with its own limit: {weight = 5, max_requests = 10}
            here = f"{where}: {str(k)[:60]}"
            w = _table(w, here, ("weight", "max_requests"), "weight and max_requests")
            if "weight" not in w:
                raise _fail(here, "a table target needs weight (and max_requests): {weight = 5, max_requests = 10}")
            if "max_requests" in w:
                limits.append((k, parse_max_requests(w["max_requests"], f"{here}: max_requests")))
            w = w["weight"]
        plain[k] = w
    value = plain
    for k, w in value.items():
        if isinstance(w, str):  # a quoted number in a file is refused: the weights are integers
            fix = f" (write {str(k)[:60]} = {w.strip()}, without quotes)" if w.strip().isdigit() else ""
            raise _fail(f"{where}: {str(k)[:60]}", f"expected an integer from 0 to {MAX_WEIGHT}, got the string "
                                                    f"{w[:40]!r}{fix}")
    weights = tuple(sorted((_token(k, where, "a subset name"), _integer(w, f"{where}: {k}", 0, MAX_WEIGHT))
                           for k, w in value.items()))
    if not sum(w for _, w in weights):
        raise _fail(where, "every weight is 0: at least one must be positive")
    return Split(weights, tuple(sorted(limits)))


def parse_max_requests(value: object, where: str) -> int:
    return _integer(value, where, 1, MAX_REQUESTS)


def _percent(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise _fail(where, f"expected a percentage from 0 to 100, got {str(value)[:40]!r}")
    return float(value)


def _status(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 16:
        return value
    if isinstance(value, str):
        name = value.strip().upper().replace("-", "_")
        for code in grpc.StatusCode:
            if code.name == name and code is not grpc.StatusCode.OK:
                return int(code.value[0])
    raise _fail(where, f"expected a gRPC status code other than OK (a name such as unavailable, or 1-16), "
                       f"got {str(value)[:40]!r}")


def _table(value: object, where: str, keys: tuple[str, ...], expected: str) -> Mapping[str, Any]:
    """``value`` as a table whose keys are all among ``keys``."""
    if not isinstance(value, Mapping):
        raise _fail(where, f"expected a table ({expected})")
    unknown = sorted(str(k) for k in set(value) - set(keys))
    if unknown:
        raise _fail(where, f"unknown key {unknown[0][:40]!r}; known: {', '.join(keys)}")
    return value


def _duration(value: object, where: str) -> float:
    try:
        return parse_positive_duration(value)
    except DurationError as e:
        raise _fail(where, str(e)) from None


def parse_fault(value: object, where: str) -> Fault:
    """``{delay = "2s", delay_percent = 50, abort = "unavailable", abort_percent = 10}``."""
    value = _table(value, where, _FAULT_KEYS, "delay and/or abort, and their _percent")
    if "delay" not in value and "abort" not in value:
        raise _fail(where, "give delay and/or abort")
    for kind in ("delay", "abort"):
        if f"{kind}_percent" in value and kind not in value:
            raise _fail(where, f"{kind}_percent without {kind}")
    delay = _duration(value["delay"], f"{where}: delay") if "delay" in value else None
    return Fault(delay=delay, delay_percent=_percent(value.get("delay_percent", 100), f"{where}: delay_percent"),
                 abort=_status(value["abort"], f"{where}: abort") if "abort" in value else None,
                 abort_percent=_percent(value.get("abort_percent", 100), f"{where}: abort_percent"))


def _route(value: object, where: str) -> Route:
    value = _table(value, where, _ROUTE_KEYS, ", ".join(_ROUTE_KEYS))
    match = parse_match(value, where)
    if match.path is None and not match.headers and match.fraction is None:
        raise _fail(where, "match on a path (service [+ method], prefix, path, safe_regex), headers and/or "
                           "runtime_fraction; the route that takes every call is the default route (the export's "
                           "split)")
    if "subset" in value and "split" in value:
        raise _fail(where, "give subset or split, not both")
    to = None
    if "subset" in value:
        to = Split(((_token(value["subset"], f"{where}: subset", "a subset name"), 1),))
    elif "split" in value:
        to = parse_split(value["split"], f"{where}: split")
    timeout = _duration(value["timeout"], f"{where}: timeout") if "timeout" in value else None
    if timeout is not None and timeout <= GRPCIO_TIMEOUT_EARLY:
        log.warning("xds %s: timeout %gs: grpcio clients fail every call at once with a route timeout this short "
                    "(they end calls about %.2f s before it); grpc-go and grpc-java honour it",
                    where, timeout, GRPCIO_TIMEOUT_EARLY)
    fault = parse_fault(value["fault"], f"{where}: fault") if "fault" in value else None
    limit = parse_max_requests(value["max_requests"], f"{where}: max_requests") if "max_requests" in value else None
    return Route(match=match, to=to, timeout=timeout, fault=fault, max_requests=limit)


def parse_routes(value: object, where: str) -> tuple[Route, ...]:
    if not isinstance(value, (list, tuple)):
        raise _fail(where, "expected a list of route tables ([[exports.NAME.routes]])")
    out = tuple(_route(r, f"{where}[{i}]") for i, r in enumerate(value))
    for i, r in enumerate(out[:-1]):
        if r.match.takes_every_call():  # gRPC takes the first route that matches: the later ones are dead
            raise _fail(f"{where}[{i + 1}]", f"never reached: routes[{i}] matches every call (the first route that "
                                             "matches takes the call); move it last or narrow it")
    return out


# ------------------------------------------------------------------ the export as a whole

def resolve_subsets(export: Export, where: str) -> tuple[Subset, ...]:
    """The export's subsets, every name in ``split`` and ``routes`` checked against them (by ``subset_key``,
    the names used are subsets too); raises XdsConfigError naming the field."""
    given = {s.name: s for s in export.subsets}
    key = export.subset_key
    used = [(name, "split") for name, _ in (export.split.weights if export.split else ())]
    for i, r in enumerate(export.routes):
        used += [(name, f"routes[{i}]") for name, _ in (r.to.weights if r.to else ())]
    if key is None and any(not s.selector for s in given.values()):
        raise _fail(where, "subsets: a list of values needs subset_key (or give a table NAME = {KEY = VALUE})")
    subsets = dict(given)
    for name, field in used:
        if name in subsets:
            continue
        if key is None:
            known = ", ".join(sorted(subsets)) or "none: set subset_key or subsets"
            raise _fail(where, f"{field}: unknown subset {name!r} (subsets: {known})")
        subsets[name] = Subset(name)
    # a subset without a selector is named by a value of subset_key (without one, the checks above raised)
    out = tuple(sorted((s if s.selector or key is None else Subset(s.name, ((key, s.name),)) for s in subsets.values()),
                       key=lambda s: s.name))
    by_selector: dict[tuple[tuple[str, str], ...], str] = {}
    for s in out:
        other = by_selector.setdefault(s.selector, s.name)
        if other != s.name:
            raise _fail(where, f"subsets {other!r} and {s.name!r} select the same instances")
    if key is not None and not out:
        raise _fail(where, "subset_key is set but no subset is named (in subsets, split or routes)")
    return out


def subset_backends(subset: Subset, backends: Iterable[Backend]) -> list[Backend]:
    """The backends ``subset`` selects."""
    return [b for b in backends if subset.selects(b.metadata)]


def destination(export: Export, to: Split | None, empty: frozenset[str], own: int | None = None) -> list[tuple[str, int]]:
    """The (cluster, weight) pairs a route sends to: ``to`` (None: the export's split, else its whole cluster),
    less the subsets in ``empty`` and the weights 0; nothing left: the export's whole cluster. ``own``: the
    index of a route with its own ``max_requests``, whose calls go to its own clusters (``route_cluster``)."""
    to = to or export.split
    if to is None:
        pairs = [(export.name, 1)]
    else:
        clusters = {s.name: s.cluster(export.name) for s in export.subsets}
        pairs = [(clusters[name], w) for name, w in to.weights if w and name not in empty] or [(export.name, 1)]
    return pairs if own is None else [(route_cluster(c, own), w) for c, w in pairs]


def route_cluster(cluster: str, index: int) -> str:
    """The cluster ``routes[index]`` sends to instead of ``cluster`` when it has its own ``max_requests``: gRPC
    counts calls in flight per cluster (gRFC A32), so a route's limit needs clusters no other route sends to.
    It shares ``cluster``'s endpoints (its EDS service name); ``#`` never appears in an export or subset name."""
    return f"{cluster}#routes[{index}]"


def owns_clusters(route: Route) -> bool:
    """Whether a route sends to clusters of its own: it has a ``max_requests``, or its ``split`` gives one."""
    return route.max_requests is not None or bool(route.to and route.to.limits)


def route_clusters(export: Export) -> dict[str, tuple[str, int | None]]:
    """The clusters of the routes that own clusters (``owns_clusters``): name -> (the cluster whose endpoints it
    shares, its limit). Every cluster such a route may send to has one: each subset of its split, with the
    target's own ``max_requests`` or else the route's or else the export's, and the export's whole cluster
    (where it sends while those subsets are empty), with the route's or the export's."""
    out: dict[str, tuple[str, int | None]] = {}
    clusters = {s.name: s.cluster(export.name) for s in export.subsets}
    for i, r in enumerate(export.routes):
        if not owns_clusters(r):
            continue
        default = r.max_requests if r.max_requests is not None else export.max_requests
        to = r.to or export.split
        for name, w in (to.weights if to else ()):
            if w:
                target = to.limit(name) if r.to is not None and to is not None else None
                out[route_cluster(clusters[name], i)] = (clusters[name], target if target is not None else default)
        out[route_cluster(export.name, i)] = (export.name, default)
    return out


def subset_limit(export: Export, subset: str) -> int | None:
    """The ``max_requests`` of a subset's own cluster: its target's in the export's ``split``, else the
    export's (shared by every route sending there without clusters of its own)."""
    own = export.split.limit(subset) if export.split is not None else None
    return own if own is not None else export.max_requests


def fault_filters_needed(export: Export) -> bool:
    return export.fault is not None or any(r.fault is not None for r in export.routes)


def empty_subsets(export: Export, counts: Mapping[str, int]) -> frozenset[str]:
    """The subsets whose assignment has no endpoint that takes calls (``counts``: subset -> such endpoints)."""
    return frozenset(s.name for s in export.subsets if not counts.get(s.name))


def describe(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))
