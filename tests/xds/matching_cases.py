"""The routing cases of gRPC's xDS interop suite as ``examples/xds/matching.toml`` writes them (no tests here): the
two calls each case is tried with, where each should go, and a reading of a RouteConfiguration as gRFC A28 tells a
client to read it (``pick``), so the built resources are checked without a client and the real clients against
the same expectations.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.type.v3 import percent_pb2

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "xds" / "matching.toml"
UNARY = "/waypost.test.Echo/Unary"
STREAM = "/waypost.test.Echo/ServerStream"
#: the suite's UnaryCall and EmptyCall: (path, headers)
CALLS: dict[str, tuple[str, dict[str, str]]] = {
    "unary": (UNARY, {"xds_md": "unary_yranu", "xds_md_numeric": "159"}),
    "stream": (STREAM, {"xds_md": "empty_ytpme"}),
}
ALT, ORIG = "alternate", "original"
#: export -> call -> the subset every such call reaches
EXPECT: dict[str, dict[str, str]] = {
    "path-full": {"unary": ORIG, "stream": ALT},
    "path-prefix": {"unary": ALT, "stream": ORIG},
    "path-two-routes": {"unary": ORIG, "stream": ALT},
    "path-regex": {"unary": ALT, "stream": ORIG},
    "path-ignore-case": {"unary": ORIG, "stream": ALT},
    "prefix-ignore-case": {"unary": ALT, "stream": ORIG},
    "header-exact": {"unary": ORIG, "stream": ALT},
    "header-prefix": {"unary": ALT, "stream": ORIG},
    "header-suffix": {"unary": ORIG, "stream": ALT},
    "header-present": {"unary": ALT, "stream": ORIG},
    "header-invert": {"unary": ORIG, "stream": ALT},
    "header-range": {"unary": ALT, "stream": ORIG},
    "header-regex": {"unary": ORIG, "stream": ALT},
    "header-contains": {"unary": ALT, "stream": ORIG},
    "breaking": {"unary": ORIG, "stream": ALT},
}
#: export -> the share of calls (percent) that reach "alternate", whatever the call
SHARES = {"splitting": 80.0, "fraction": 25.0}
_PER_MILLION = {percent_pb2.FractionalPercent.HUNDRED: 10_000, percent_pb2.FractionalPercent.TEN_THOUSAND: 100,
                percent_pb2.FractionalPercent.MILLION: 1}


def _re2(regex: str) -> str:
    return regex.replace("\\z", "\\Z")  # the only RE2 spelling the example set uses that Python reads otherwise


def _header_matches(h: rc_pb2.HeaderMatcher, headers: dict[str, str]) -> bool:
    value = headers.get(h.name)
    kind = h.WhichOneof("header_match_specifier")
    if kind == "present_match":
        ok = (value is not None) == h.present_match
    elif value is None:
        ok = False  # gRFC A28: a matcher other than present never matches an absent header, inverted or not
        return ok
    elif kind == "range_match":
        ok = bool(re.fullmatch(r"[+-]?\d+", value)) and h.range_match.start <= int(value) < h.range_match.end
    elif kind == "safe_regex_match":
        ok = re.fullmatch(_re2(h.safe_regex_match.regex), value) is not None
    elif kind == "string_match":
        sm = h.string_match
        which = sm.WhichOneof("match_pattern")
        want = getattr(sm, which)
        ok = {"exact": value == want, "prefix": value.startswith(want), "suffix": value.endswith(want),
              "contains": want in value}[which]
    else:
        raise AssertionError(f"unexpected header matcher {kind}")
    return ok != h.invert_match


def _path_matches(m: rc_pb2.RouteMatch, path: str) -> bool:
    kind = m.WhichOneof("path_specifier")
    insensitive = m.HasField("case_sensitive") and not m.case_sensitive.value
    if kind == "safe_regex":
        return re.fullmatch(_re2(m.safe_regex.regex), path) is not None
    want = getattr(m, kind)
    if insensitive:
        want, path = want.lower(), path.lower()
    return path == want if kind == "path" else path.startswith(want)


def pick(rc: Any, path: str, headers: dict[str, str], rng: random.Random) -> str:
    """The cluster a gRPC client sends a call to under RouteConfiguration ``rc`` (gRFC A28: the first route
    whose path, headers and runtime_fraction match; a weighted cluster by weight)."""
    for route in rc.virtual_hosts[0].routes:
        m = route.match
        if not _path_matches(m, path) or not all(_header_matches(h, headers) for h in m.headers):
            continue
        if m.HasField("runtime_fraction"):
            d = m.runtime_fraction.default_value
            if rng.randrange(1_000_000) >= d.numerator * _PER_MILLION[d.denominator]:
                continue
        action = route.route
        if action.WhichOneof("cluster_specifier") == "cluster":
            return str(action.cluster)
        clusters = action.weighted_clusters.clusters
        x = rng.randrange(sum(c.weight.value for c in clusters))
        for c in clusters:
            x -= c.weight.value
            if x < 0:
                return str(c.name)
    raise AssertionError(f"no route matched {path} {headers}")


def subset_of(cluster: str) -> str:
    """``NAME/backend=VALUE[#routes[I]]`` -> VALUE."""
    return cluster.split("backend=", 1)[1].split("#", 1)[0]
