"""Route matching (gRFC A28) without a network peer: every case of gRPC's xDS interop suite as
``examples/xds/matching.toml`` writes it, read back from the RouteConfiguration built (``matching_cases.pick``);
the Envoy fields each matcher becomes; one clear error per mistake (hypothesis fuzzes the route tables); regexes
refused for what RE2 lacks; a route's own max_requests on clusters of its own."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from envoy.type.v3 import percent_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.xds.matching_cases import CALLS, EXAMPLE, EXPECT, SHARES, pick, subset_of
from waypost.types import Backend
from waypost.xds import XdsConfigError, load_config
from waypost.xds.exports import config_from_dict
from waypost.xds.matching import re2_problem
from waypost.xds.resources import route_config, static_resources, subset_assignments, subset_clusters

T = "direct:///127.0.0.1:1"


def _export(**options: Any):
    return config_from_dict({"exports": {"g": {"target": T, **options}}}, "cfg").exports[0]


def _match(**route: Any):
    """The RouteMatch of one route (to subset v2) of an export split by version."""
    e = _export(subset_key="version", split={"v1": 1}, routes=[{**route, "subset": "v2"}])
    return route_config(e).virtual_hosts[0].routes[0].match


@pytest.fixture(scope="module", name="example")
def fixture_example() -> dict[str, Any]:
    return {e.name: e for e in load_config(EXAMPLE).exports}


def test_the_example_has_every_case_and_each_sends_each_call_where_the_suite_expects(example) -> None:
    assert set(example) == set(EXPECT) | set(SHARES)
    rng = random.Random(7)
    for name, where in EXPECT.items():
        rc = route_config(example[name])
        for call, subset in where.items():
            path, headers = CALLS[call]
            got = {subset_of(pick(rc, path, headers, rng)) for _ in range(20)}
            assert got == {subset}, (name, call, got)


def test_the_example_shares(example) -> None:
    rng = random.Random(11)
    for name, share in SHARES.items():
        rc = route_config(example[name])
        for path, headers in CALLS.values():
            alt = sum(subset_of(pick(rc, path, headers, rng)) == "alternate" for _ in range(4000))
            assert abs(100 * alt / 4000 - share) < 3, (name, alt)


def test_path_matchers_become_the_route_match_path_specifier() -> None:
    m = _match(prefix="/pkg.Svc/Un")
    assert m.prefix == "/pkg.Svc/Un" and not m.HasField("case_sensitive")
    m = _match(path="/PKG.svc/m", case_sensitive=False)
    assert m.path == "/PKG.svc/m" and m.HasField("case_sensitive") and m.case_sensitive.value is False
    m = _match(safe_regex="/pkg[.]Svc/.*")
    assert m.safe_regex.regex == "/pkg[.]Svc/.*"
    m = _match(service="pkg.Svc", method="M", case_sensitive=True)
    assert m.path == "/pkg.Svc/M" and m.case_sensitive.value is True
    assert _match(service="pkg.Svc").prefix == "/pkg.Svc/"
    m = _match(headers={"x": "1"})  # no path matcher: the prefix ""
    assert m.WhichOneof("path_specifier") == "prefix" and m.prefix == ""


def test_header_matchers_become_header_matchers_with_invert() -> None:
    m = _match(headers={"a": "1", "b": {"prefix": "p"}, "c": {"suffix": "s", "invert_match": True},
                        "d": {"contains": "c"}, "e": {"present": False}, "f": {"safe_regex": "x.*"},
                        "g": {"range": {"start": -5, "end": 2**63 - 1}}, "h": {"exact": ""}})
    by = {h.name: h for h in m.headers}
    assert by["a"].string_match.exact == "1" and not by["a"].invert_match
    assert by["b"].string_match.prefix == "p"
    assert by["c"].string_match.suffix == "s" and by["c"].invert_match
    assert by["d"].string_match.contains == "c"
    assert by["e"].WhichOneof("header_match_specifier") == "present_match" and by["e"].present_match is False
    assert by["f"].safe_regex_match.regex == "x.*"
    assert (by["g"].range_match.start, by["g"].range_match.end) == (-5, 2**63 - 1)
    assert by["h"].WhichOneof("header_match_specifier") == "string_match" and by["h"].string_match.exact == ""
    assert [h.name for h in m.headers] == sorted(by)  # sorted: equal configs, equal bytes


@pytest.mark.parametrize(("fraction", "sent"), [
    (25, (25, percent_pb2.FractionalPercent.HUNDRED)),
    (0.5, (5000, percent_pb2.FractionalPercent.MILLION)),
    ({"numerator": 3, "denominator": "ten_thousand"}, (3, percent_pb2.FractionalPercent.TEN_THOUSAND)),
    ({"numerator": 7}, (7, percent_pb2.FractionalPercent.HUNDRED)),
])
def test_runtime_fraction_is_its_default_value(fraction: Any, sent: tuple[int, int]) -> None:
    d = _match(runtime_fraction=fraction).runtime_fraction.default_value
    assert (d.numerator, d.denominator) == sent


def test_a_routes_own_max_requests_gets_clusters_of_its_own_sharing_the_endpoints() -> None:
    e = _export(subset_key="version", split={"v1": 3, "v2": 1}, max_requests=100, routes=[
        {"path": "/p.S/A", "subset": "v1", "max_requests": 5},
        {"path": "/p.S/B", "max_requests": 7},  # where the default route sends: the split
        {"path": "/p.S/C", "subset": "v2"},
    ])
    clusters = subset_clusters(e)
    limits = {n: (c.eds_cluster_config.service_name, c.circuit_breakers.thresholds[0].max_requests.value)
              for n, c in clusters.items()}
    assert limits == {
        "g/version=v1": ("", 100), "g/version=v2": ("", 100),
        "g/version=v1#routes[0]": ("g/version=v1", 5), "g#routes[0]": ("g", 5),
        "g/version=v1#routes[1]": ("g/version=v1", 7), "g/version=v2#routes[1]": ("g/version=v2", 7),
        "g#routes[1]": ("g", 7)}
    a, b, c, _default = route_config(e).virtual_hosts[0].routes
    assert a.route.cluster == "g/version=v1#routes[0]"
    assert [(w.name, w.weight.value) for w in b.route.weighted_clusters.clusters] == [
        ("g/version=v1#routes[1]", 3), ("g/version=v2#routes[1]", 1)]
    assert c.route.cluster == "g/version=v2"
    # an empty subset: the route's own cluster of the whole export takes its calls
    assert route_config(e, frozenset({"v1"})).virtual_hosts[0].routes[0].route.cluster == "g#routes[0]"
    # the route clusters read assignments the export serves anyway: no new one
    assert {n for n, _ in subset_assignments(e, [Backend("127.0.0.1:1", {"version": "v1"})]).items()} == {"v1", "v2"}


def test_without_max_requests_on_routes_there_is_no_route_cluster() -> None:
    e = _export(subset_key="version", split={"v1": 1}, routes=[{"prefix": "/p.S/", "subset": "v2"}])
    assert sorted(subset_clusters(e)) == ["g/version=v1", "g/version=v2"]
    assert not static_resources(e)["type.googleapis.com/envoy.config.cluster.v3.Cluster"].eds_cluster_config.service_name


# ------------------------------------------------------------------------ mistakes: one clear error each

@pytest.mark.parametrize(("route", "says"), [
    ({"prefix": "/a/", "path": "/a/b"}, r"routes\[0\]: two path matchers \(prefix and path\)"),
    ({"service": "a.B", "safe_regex": ".*"}, r"two path matchers \(service and safe_regex\)"),
    ({"prefix": "a.B/"}, r"routes\[0\]: prefix: 'a.B/' never matches: a gRPC path starts with '/'"),
    ({"path": ""}, r"routes\[0\]: path: expected a non-empty string"),
    ({"safe_regex": "(a)\\1"}, r"routes\[0\]: safe_regex: '\(a\)\\1': backreference \\1 .*RE2 has no backreferences"),
    ({"safe_regex": "a(?=b)"}, "lookahead/lookbehind"),
    ({"safe_regex": "(?<!a)b"}, "lookahead/lookbehind"),
    ({"safe_regex": "(?P<x>a)(?P=x)"}, "RE2 has no backreferences"),
    ({"safe_regex": "(?>a)"}, "atomic group"),
    ({"safe_regex": "a*+"}, "possessive"),
    ({"safe_regex": "a{1001}"}, "above 1000"),
    ({"safe_regex": "(?x)a b"}, "RE2 has only i, m, s and U"),
    ({"safe_regex": "a\\Z"}, "write \\\\z or \\$"),
    ({"safe_regex": "(a"}, "not a valid regex: missing \\)"),
    ({"safe_regex": ""}, r"routes\[0\]: safe_regex: the regex: expected a non-empty string"),
    ({"safe_regex": "a{,3}"}, r"\{,3\} at position 1: RE2 reads it as text; write \{0,3\}"),
    ({"safe_regex": "(?#note)a"}, "comment group"),
    ({"safe_regex": "\\u00e9"}, r"RE2 has no \\N\{...\}, \\u or \\U escapes"),
    ({"safe_regex": "/a", "case_sensitive": False}, "write \\(\\?i\\) at the start of the regex"),
    ({"case_sensitive": False, "headers": {"x": "1"}}, "case_sensitive: goes with a path matcher"),
    ({"prefix": "/a", "case_sensitive": "no"}, "case_sensitive: expected true or false"),
    ({"headers": {"x": {"range": {"start": 200, "end": 100}}}},
     r"headers: 'x': range: start 200 is not below end 100: .*start inclusive, end exclusive"),
    ({"headers": {"x": {"range": {"start": 5, "end": 5}}}}, "start 5 is not below end 5"),
    ({"headers": {"x": {"range": {"start": 0, "end": 2**63}}}}, r"range: end: expected an integer \(int64\)"),
    ({"headers": {"x": {"range": [1, 2]}}}, r"expected \{start = N, end = M\}"),
    ({"headers": {"x": {"regex": "a"}}}, "unknown matcher 'regex'; known: exact, prefix, suffix, contains, present"),
    ({"headers": {"x": {"exact": "a", "prefix": "a"}}}, "give one matcher of .*, not exact and prefix"),
    ({"headers": {"x": {"invert_match": True}}}, "give one matcher of"),
    ({"headers": {"x": {"prefix": ""}}}, "prefix: the value: expected a non-empty string"),
    ({"headers": {"x": {"present": "yes"}}}, r"present: expected true \(the header is sent\) or false"),
    ({"headers": {"x": {"exact": "a", "invert_match": 1}}}, "invert_match: expected true or false"),
    ({"headers": {"x": {"safe_regex": "(?=a)"}}}, r"headers: 'x': safe_regex: '\(\?=a\)': lookahead"),
    ({"headers": {"grpc-timeout": "1"}}, "-bin or grpc-"),
    ({"runtime_fraction": 101}, "runtime_fraction: expected a percentage from 0 to 100"),
    ({"runtime_fraction": {"numerator": 5, "denominator": "thousand"}}, "denominator: expected hundred"),
    ({"runtime_fraction": {"numerator": 101}}, "numerator: expected an integer from 0 to 100"),
    ({"prefix": "/a/", "max_requests": 0}, r"routes\[0\]: max_requests: expected an integer from 1"),
])
def test_each_mistake_is_one_error_naming_export_field_and_value(route: dict[str, Any], says: str) -> None:
    with pytest.raises(XdsConfigError, match=says) as err:
        _export(subset_key="version", split={"v1": 1}, routes=[{**route, "subset": "v2"}])
    assert str(err.value).startswith("cfg: export 'g': routes[0]"), str(err.value)
    assert "\n" not in str(err.value)


def test_a_route_after_one_that_matches_every_call_is_refused() -> None:
    with pytest.raises(XdsConfigError, match=r"routes\[1\]: never reached: .*routes\[0\] matches every call"):
        _export(routes=[{"prefix": "/"}, {"headers": {"x": "1"}}])
    _export(routes=[{"headers": {"x": "1"}}, {"prefix": "/", "timeout": "5s"}])  # last: fine
    _export(routes=[{"prefix": "/", "runtime_fraction": 10}, {"headers": {"x": "1"}}])  # a share: later ones reached


@pytest.mark.parametrize("regex", ["^\\/.*\\/Unary$", "(?i)/pkg\\.svc/.*", "a{2,1000}", "[a-z]+\\d*",
                                   "[[:alpha:]]+", "(?s:.)", "(?P<n>a)|b", "\\Aab\\z", "x*?y+?"])
def test_re2_regexes_are_accepted(regex: str) -> None:
    assert re2_problem(regex) is None


# ------------------------------------------------------------------------ fuzz

_s = st.text(alphabet=st.sampled_from(list("ab/.*?+()[]{}\\^$|=!<>?:0129zZPxi-")), max_size=12)
_value: Any = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(allow_nan=True), _s)
_header = st.one_of(_s, st.dictionaries(
    st.sampled_from(["exact", "prefix", "suffix", "contains", "present", "safe_regex", "range", "invert_match", "re"]),
    st.one_of(_value, st.fixed_dictionaries({}, optional={"start": _value, "end": _value})), max_size=3), _value)
_route = st.dictionaries(
    st.sampled_from(["service", "method", "prefix", "path", "safe_regex", "case_sensitive", "headers",
                     "runtime_fraction", "subset", "max_requests", "timeout", "zz"]),
    st.one_of(_value, st.dictionaries(st.sampled_from(["x-a", "xds_md", "grpc-x", "a-bin", "Bad"]), _header,
                                      max_size=2),
              st.fixed_dictionaries({}, optional={"numerator": _value, "denominator": _value})),
    max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_route, max_size=3))
def test_fuzz_routes(routes: list[dict[str, Any]]) -> None:
    """Any route tables: an XdsConfigError naming the export, or an export whose resources build, with every
    regex in them compiling (Python's re standing in for RE2 for what both accept)."""
    try:
        e = _export(subset_key="version", split={"v1": 1}, routes=routes)
    except XdsConfigError as err:
        assert str(err).startswith("cfg: export 'g': "), str(err)
        return
    rc = route_config(e)
    for r in rc.virtual_hosts[0].routes:
        regexes = [r.match.safe_regex.regex] if r.match.HasField("safe_regex") else []
        regexes += [h.safe_regex_match.regex for h in r.match.headers if h.HasField("safe_regex_match")]
        for x in regexes:
            re.compile(x.replace("\\z", "\\Z"))
    subset_clusters(e)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # Python on [[...: not the check's concern
@settings(max_examples=500, deadline=None)
@given(_s)
def test_fuzz_re2_check_never_raises_and_accepts_only_what_python_compiles(regex: str) -> None:
    problem = re2_problem(regex)
    if problem is None:
        re.compile(regex.replace("\\z", "\\Z"))
    else:
        assert isinstance(problem, str) and problem


def test_the_docs_route_matching_section_loads_and_shows_the_real_errors() -> None:
    from tests.xds.matching_cases import ROOT
    from waypost.xds.exports import parse_config

    doc = (ROOT / "docs" / "xds.md").read_text()
    section = doc[doc.index("### Route matching"):doc.index("## Client status")]
    first, whole = re.findall(r"```toml\n(.*?)```", section, re.DOTALL)
    e = parse_config(f'[exports.greeter]\ntarget = "{T}"\nsubset_key = "version"\n' + first).exports[0]
    (r,) = e.routes
    assert r.max_requests == 50 and r.match.fraction is not None and len(r.match.headers) == 2
    def bare(text: str) -> str:  # the example's lines carry comments the docs leave out
        return "\n".join(re.sub(r"\s+#.*", "", line).rstrip() for line in text.splitlines())

    assert bare(whole) in bare(EXAMPLE.read_text())
    shown = re.search(r"```\n(cfg: .*?)```", section, re.DOTALL)
    assert shown is not None
    mistakes = [[{"prefix": "/a", "path": "/a/b"}], [{"headers": {"x-build": {"range": {"start": 200, "end": 100}}}}],
                [{"headers": {"x-tier": {"regex": "a"}}}], [{"safe_regex": "(a)\\1"}],
                [{"headers": {"a": "1"}}, {"prefix": "/"}, {"headers": {"b": "1"}}]]
    for line, routes in zip(shown.group(1).splitlines(), mistakes, strict=True):
        with pytest.raises(XdsConfigError) as err:
            config_from_dict({"exports": {"greeter": {"target": T, "subset_key": "version", "routes": [
                {**r, "subset": "v2"} for r in routes]}}}, "cfg")
        assert str(err.value) == line


def test_a_reload_with_a_bad_matcher_keeps_the_last_good_config(tmp_path, caplog) -> None:
    import logging

    from waypost.xds.reload import ConfigReloader

    path = tmp_path / "xds.toml"
    good = f'[exports.g]\ntarget = "{T}"\n[[exports.g.routes]]\nsafe_regex = "/a[.]B/.*"\n'
    path.write_text(good)
    applied: list[Any] = []
    r = ConfigReloader(path, lambda: load_config(path), applied.append)
    path.write_text(good.replace("/a[.]B/.*", "/a(?!x)/.*") + "\n")
    with caplog.at_level(logging.ERROR, logger="waypost.xds"):
        assert not r.check() and not applied
    line = next(rec.getMessage() for rec in caplog.records if "not reloaded" in rec.getMessage())
    assert "export 'g': routes[0]: safe_regex: '/a(?!x)/.*': lookahead/lookbehind" in line, line
    assert "the last good one stays" in line, line
    path.write_text(good.replace("/a[.]B/.*", "/a[.]C/.*"))
    assert r.check() and applied[-1].exports[0].routes[0].match.path.value == "/a[.]C/.*"


_re2_alphabet = list("ab/.*?+()[]{}\\^$|=!<>:0129zZPxisU-,#dwAbB")


@pytest.mark.filterwarnings("ignore::FutureWarning")
@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=st.sampled_from(_re2_alphabet), min_size=1, max_size=12))
def test_what_the_check_accepts_compiles_under_re2(regex: str) -> None:
    """Against RE2 itself (google-re2, C++ RE2 as C-core uses): every regex the check accepts compiles. (It refuses
    a few RE2 accepts, e.g. a repeated anchor ``^+``: Python's parser, which the check uses, refuses those.)"""
    re2 = pytest.importorskip("re2", reason="google-re2 (a dev dependency) is not installed")
    if re2_problem(regex) is None:
        re2.compile(regex)


def test_a_split_target_may_carry_its_own_max_requests() -> None:
    """In the export's split, a target's limit is its subset cluster's (shared by the routes without clusters of
    their own); in a route's split, each target gets a route cluster with its limit, the others the route's or
    the export's."""
    e = _export(subset_key="version", max_requests=100,
                split={"v1": 95, "v2": {"weight": 5, "max_requests": 10}},
                routes=[{"headers": {"x": "1"}, "split": {"v1": {"weight": 1, "max_requests": 7}, "v2": 1}},
                        {"headers": {"y": "1"}, "subset": "v2"}])
    limits = {n: c.circuit_breakers.thresholds[0].max_requests.value for n, c in subset_clusters(e).items()}
    assert limits == {"g/version=v1": 100, "g/version=v2": 10, "g/version=v1#routes[0]": 7,
                      "g/version=v2#routes[0]": 100, "g#routes[0]": 100}
    default = route_config(e).virtual_hosts[0].routes[-1]
    assert [(w.name, w.weight.value) for w in default.route.weighted_clusters.clusters] == [
        ("g/version=v1", 95), ("g/version=v2", 5)]
    assert route_config(e).virtual_hosts[0].routes[1].route.cluster == "g/version=v2"  # shares v2's 10
    for bad, says in ((
            {"v1": {"max_requests": 3}}, r"split: v1: a table target needs weight"),
            ({"v1": {"weight": 1, "max_requests": 0}}, r"split: v1: max_requests: expected an integer from 1"),
            ({"v1": {"weight": 1, "limit": 3}}, r"split: v1: unknown key 'limit'")):
        with pytest.raises(XdsConfigError, match=says):
            _export(subset_key="version", split=bad)
