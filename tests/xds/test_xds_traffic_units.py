"""Traffic policy without a network peer: the config fields (parsed, and every bad input an XdsConfigError naming the
export and the field: hypothesis), the resources they become (subset Clusters and assignments, weighted_clusters,
header routes, A31 timeouts, A32 circuit breakers, A33 faults), exports without them built exactly as before, empty
subsets left out of splits, ``ControlPlane.replace_exports`` and the config reloader."""

from __future__ import annotations

import hashlib
import logging
import string
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.waiting import wait_until
from waypost import _loop
from waypost.types import Backend
from waypost.xds import XdsConfigError, parse_export
from waypost.xds.control import ControlPlane
from waypost.xds.exports import config_from_dict
from waypost.xds.reload import ConfigReloader
from waypost.xds.resources import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    load_assignment,
    pack,
    route_config,
    static_resources,
    subset_assignments,
    subset_clusters,
)

T = "direct:///127.0.0.1:1"


def _export(**options: Any):
    return config_from_dict({"exports": {"g": {"target": T, **options}}}).exports[0]


def _b(addr: str, **meta: Any) -> Backend:
    return Backend(addr, meta)


def _digest(msg) -> str:
    return hashlib.sha256(pack(msg).SerializeToString(deterministic=True)).hexdigest()[:16]


def _hcm(listener) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.api_listener.api_listener.Unpack(hcm)
    return hcm


# ------------------------------------------------------------------------ exports without the options: as before

#: digests of the Listener/RouteConfiguration/Cluster built before the traffic options existed (same exports)
BEFORE = {
    "plain": ("663b9f14a1735c33", "d1584f4be5a58bea", "ef52791caac3df0e"),
    "hash": ("238759cb7cc3aa47", "8c4734329fcfe15f", "8b0d9fb9afb3dab0"),
}


def test_exports_without_traffic_options_build_exactly_the_resources_of_before() -> None:
    for name, spec in {"plain": "", "hash": " policy=ring_hash hash_header=x-user"}.items():
        e = parse_export(f"{name}={T}{spec}")
        res = static_resources(e)
        assert tuple(_digest(res[t]) for t in (LISTENER, ROUTE, CLUSTER)) == BEFORE[name], name
        assert e.subsets == () and subset_clusters(e) == {} and subset_assignments(e, [_b("10.0.0.1:1")]) == {}


def test_control_plane_serves_a_plain_export_as_before() -> None:
    e = parse_export(f"g={T} prefer=zone:a")
    cp = ControlPlane([e])
    cp._static["g"] = {t: _res("g", m) for t, m in static_resources(e).items()}
    cp._mark = lambda: cp._rebuild()  # type: ignore[method-assign]
    backends = (_b("10.0.0.1:1", zone="a", version="v1"), _b("10.0.0.2:1", zone="b", version="v2"))
    cp._update("g", backends)
    snap = cp.snapshot
    assert {t: sorted(snap.names(t)) for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT)} == {
        LISTENER: ["g"], ROUTE: ["g"], CLUSTER: ["g"], ENDPOINT: ["g"]}
    assert snap.names(ENDPOINT)["g"] == _res("g", load_assignment(e, backends))


def _res(name, msg):
    from waypost.xds.snapshot import Resource

    return Resource.of(name, msg)


# ------------------------------------------------------------------------ the resources

BACKENDS = [_b("10.0.0.1:1", version="v1"), _b("10.0.0.2:1", version="v1"), _b("10.0.0.3:1", version="v2"),
            _b("10.0.0.4:1", version="v3", weight=0), _b("10.0.0.5:1")]


def test_subsets_are_clusters_of_their_own_with_the_export_policy() -> None:
    e = _export(subset_key="version", split={"v1": 95, "v2": 5}, policy="ring_hash", max_requests=7)
    assert [s.name for s in e.subsets] == ["v1", "v2"]
    clusters = subset_clusters(e)
    assert sorted(clusters) == ["g/version=v1", "g/version=v2"]
    base = static_resources(e)[CLUSTER]
    for name, c in clusters.items():
        assert c.name == name and c.eds_cluster_config == base.eds_cluster_config
        assert c.load_balancing_policy == base.load_balancing_policy
        assert c.circuit_breakers.thresholds[0].max_requests.value == 7
        assert c.circuit_breakers.thresholds[0].priority == 0  # DEFAULT
    parts = subset_assignments(e, BACKENDS)
    v1, live = parts["v1"]
    assert v1.cluster_name == "g/version=v1" and live == 2
    assert sorted(ep.endpoint.address.socket_address.address for loc in v1.endpoints for ep in loc.lb_endpoints) == [
        "10.0.0.1", "10.0.0.2"]
    assert parts["v2"][1] == 1


def test_split_is_weighted_clusters_and_leaves_out_empty_subsets() -> None:
    e = _export(subset_key="version", split={"v2": 5, "v1": 95})
    action = route_config(e).virtual_hosts[0].routes[-1].route
    assert [(c.name, c.weight.value) for c in action.weighted_clusters.clusters] == [
        ("g/version=v1", 95), ("g/version=v2", 5)]
    only = route_config(e, frozenset({"v2"})).virtual_hosts[0].routes[-1].route
    assert only.cluster == "g/version=v1" and not only.HasField("weighted_clusters")
    none = route_config(e, frozenset({"v1", "v2"})).virtual_hosts[0].routes[-1].route
    assert none.cluster == "g"  # every subset empty: the whole cluster
    assert _digest(route_config(_export(subset_key="version", split={"v1": 95, "v2": 5}))) == _digest(route_config(e))


def test_header_and_method_routes_come_first_then_service_config_then_default() -> None:
    e = _export(subset_key="version", split={"v1": 100}, routes=[
        {"headers": {"x-canary": "1"}, "subset": "v2", "timeout": "1.5s"},
        {"headers": {"x-user": {"prefix": "test-"}, "x-debug": {"present": True}}, "split": {"v1": 1, "v2": 1}},
        {"service": "pkg.Svc", "method": "Slow", "timeout": "30s", "fault": {"abort": "unavailable",
                                                                              "abort_percent": 0.5}},
    ], service_config={"methodConfig": [{"name": [{"service": "pkg.Svc", "method": "M"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]})
    rs = route_config(e).virtual_hosts[0].routes
    assert len(rs) == 5
    canary, both, slow, method, default = rs
    assert canary.match.prefix == "" and canary.match.headers[0].name == "x-canary"
    assert canary.match.headers[0].string_match.exact == "1" and canary.route.cluster == "g/version=v2"
    assert canary.route.max_stream_duration.max_stream_duration.ToMilliseconds() == 1500
    assert [(h.name, h.present_match, h.string_match.prefix) for h in both.match.headers] == [
        ("x-debug", True, ""), ("x-user", False, "test-")]
    assert len(both.route.weighted_clusters.clusters) == 2
    assert slow.match.path == "/pkg.Svc/Slow" and slow.route.cluster == "g/version=v1"
    fault = fault_pb2.HTTPFault()
    slow.typed_per_filter_config["envoy.filters.http.fault"].Unpack(fault)
    assert fault.abort.grpc_status == 14 and (fault.abort.percentage.numerator, fault.abort.percentage.denominator) == (
        5000, 2)  # per million
    assert method.match.path == "/pkg.Svc/M" and method.route.retry_policy.num_retries.value == 2
    assert method.route.cluster == "g/version=v1" and default.match.prefix == "" and not default.match.headers
    # the Listener carries the fault filter (empty: no export-wide fault) before the router
    names = [f.name for f in _hcm(static_resources(e)[LISTENER]).http_filters]
    assert names == ["envoy.filters.http.fault", "envoy.filters.http.router"]


def test_export_fault_is_the_listener_filter() -> None:
    e = _export(fault={"delay": "2s", "delay_percent": 50, "abort": "unavailable", "abort_percent": 10})
    hcm = _hcm(static_resources(e)[LISTENER])
    fault = fault_pb2.HTTPFault()
    hcm.http_filters[0].typed_config.Unpack(fault)
    assert fault.delay.fixed_delay.seconds == 2 and fault.delay.percentage.numerator == 50
    assert fault.abort.grpc_status == 14 and fault.abort.percentage.numerator == 10
    assert fault.abort.percentage.denominator == 0  # HUNDRED


def test_table_subsets_and_command_line_forms() -> None:
    e = _export(subsets={"stable": {"version": "v1"}, "canary": {"version": "v2", "zone": "a"}},
                split={"stable": 9, "canary": 1})
    assert sorted(subset_clusters(e)) == ["g/version=v1", "g/version=v2,zone=a"]
    c = parse_export(f"g={T} subset_key=version split=v1:95,v2:5 max_requests=100 subsets=v1,v2,v3")
    assert [s.name for s in c.subsets] == ["v1", "v2", "v3"] and c.max_requests == 100
    assert c.split is not None and c.split.weights == (("v1", 95), ("v2", 5))


@pytest.mark.parametrize(("options", "says"), [
    ({"split": {"v1": 1}}, "split: unknown subset 'v1'"),
    ({"subsets": ["v1"]}, "needs subset_key"),
    ({"subset_key": "version"}, "no subset is named"),
    ({"subset_key": "version", "split": {"v1": 0}}, "every weight is 0"),
    ({"subset_key": "version", "split": {"v1": -1}}, "split: v1: expected an integer"),
    ({"subset_key": "version", "split": {"v1": 90, "v2": "10"}},  # weights are integers: a quoted one is refused
     r"split: v2: expected an integer from 0 to 1000000, got the string '10' \(write v2 = 10, without quotes\)"),
    ({"subset_key": "version", "split": {"v1": "x"}}, r"split: v1: expected an integer .* got the string 'x'$"),
    ({"subset_key": "bad key"}, "subset_key: the metadata key must be"),
    ({"subset_key": "version", "split": "v1=3"}, "SUBSET:WEIGHT"),
    ({"subsets": {"a": {"version": "v1"}, "b": {"version": "v1"}}}, "select the same instances"),
    ({"routes": [{"subset": "v1"}]}, r"routes\[0\]: match on a path"),
    ({"routes": [{"method": "M", "headers": {"x": "1"}}]}, "method needs service"),
    ({"routes": [{"headers": {"x-bin": "1"}}]}, "-bin or grpc-"),
    ({"routes": [{"headers": {"x": {"regex": ".*"}}}]}, "unknown matcher 'regex'; known: exact, prefix"),
    ({"routes": [{"headers": {"x": "1"}, "timeout": "0s"}]}, r"routes\[0\]: timeout"),
    ({"routes": [{"headers": {"x": "1"}, "colour": 1}]}, "unknown key 'colour'"),
    ({"subset_key": "version", "routes": [{"headers": {"x": "1"}, "subset": "v1", "split": {"v1": 1}}]}, "not both"),
    ({"max_requests": 0}, "max_requests: expected an integer from 1"),
    ({"fault": {}}, "delay and/or abort"),
    ({"fault": {"abort": "ok"}}, "other than OK"),
    ({"fault": {"delay": "1s", "delay_percent": 101}}, "0 to 100"),
    ({"fault": {"abort_percent": 5, "delay": "1s"}}, "abort_percent without abort"),
])
def test_bad_traffic_options_name_the_export_and_field(options: dict[str, Any], says: str) -> None:
    with pytest.raises(XdsConfigError, match=says) as err:
        config_from_dict({"exports": {"g": {"target": T, **options}}}, "cfg")
    assert str(err.value).startswith("cfg: export 'g': "), str(err.value)


def test_object_options_are_config_file_only() -> None:
    for key in ("routes", "fault"):
        with pytest.raises(XdsConfigError, match="config file"):
            parse_export(f"g={T} {key}=x")


_text = st.text(alphabet=string.ascii_letters + string.digits + "-_.=:, /é", max_size=20)
_scalar = st.none() | st.booleans() | st.integers(-3, 2**33) | st.floats(allow_nan=True) | _text
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                      max_leaves=12)
_route = st.dictionaries(st.sampled_from(["service", "method", "prefix", "path", "safe_regex", "case_sensitive",
                                          "headers", "runtime_fraction", "subset", "split", "timeout", "fault",
                                          "max_requests", "x"]),
                         _value | st.dictionaries(st.sampled_from(["x-canary", "v1", "v2", "prefix", "present"]),
                                                  _value, max_size=2), max_size=4)
_traffic = st.fixed_dictionaries({}, optional={
    "subset_key": st.sampled_from(["version", "zone"]) | _value,
    "subsets": st.lists(st.sampled_from(["v1", "v2"]), max_size=3) | _value,
    "split": st.dictionaries(st.sampled_from(["v1", "v2", "v3"]), st.integers(-1, 200), max_size=3) | _value,
    "routes": st.lists(_route, max_size=3) | _value,
    "max_requests": st.integers(-1, 2**33) | _value,
    "fault": st.dictionaries(st.sampled_from(["delay", "delay_percent", "abort", "abort_percent", "y"]),
                             _value | st.sampled_from(["1s", "unavailable", 50]), max_size=4) | _value,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_traffic)
def test_fuzz_traffic_options(options: dict[str, Any]) -> None:
    try:
        cfg = config_from_dict({"exports": {"g": {"target": T, **options}}}, "cfg")
    except XdsConfigError as e:
        assert str(e).startswith("cfg: export 'g': "), str(e)
        return
    e = cfg.exports[0]  # accepted: it builds, deterministically
    names = {s.name for s in e.subsets}
    for empty in (frozenset(), frozenset(names)):
        assert _digest(route_config(e, empty)) == _digest(route_config(e, empty))
    static_resources(e)
    subset_clusters(e)
    subset_assignments(e, BACKENDS)


# ------------------------------------------------------------------------ the control plane

def _feed(cp: ControlPlane, name: str, backends: tuple[Backend, ...]) -> None:
    """Serve ``backends`` as the list of ``name`` (once its direct:/// source's own answer is in, so that it does not
    come after)."""
    wait_until(lambda: cp.endpoints(name) is not None, 10, f"the first list of {name}")

    async def feed() -> None:
        cp._update(name, backends, cp._generation[name])
        cp._rebuild()

    _loop.run(feed(), 10)


def _route_action(cp: ControlPlane, name: str):
    from envoy.config.route.v3 import route_pb2

    rc = route_pb2.RouteConfiguration()
    from google.protobuf import any_pb2

    any_msg = any_pb2.Any.FromString(cp.snapshot.names(ROUTE)[name].any_bytes)
    any_msg.Unpack(rc)
    return rc.virtual_hosts[0].routes[-1].route


def test_empty_subset_leaves_the_split_and_comes_back(caplog) -> None:
    e = _export(subset_key="version", split={"v1": 95, "v2": 5})
    cp = ControlPlane([e])
    cp.start()
    try:
        with caplog.at_level(logging.WARNING, logger="waypost.xds"):
            _feed(cp, "g", (_b("10.0.0.1:1", version="v1"),))
        assert _route_action(cp, "g").cluster == "g/version=v1"
        # (the direct:/// source's own list, with no metadata, may have come first: both empty, then v1 back)
        assert "'v2' have no endpoint" in caplog.text or "'v1', 'v2' have no endpoint" in caplog.text
        assert sorted(cp.snapshot.names(ENDPOINT)) == ["g", "g/version=v1", "g/version=v2"]
        assert sorted(cp.snapshot.names(CLUSTER)) == ["g", "g/version=v1", "g/version=v2"]
        _feed(cp, "g", (_b("10.0.0.1:1", version="v1"), _b("10.0.0.2:1", version="v2")))
        assert len(_route_action(cp, "g").weighted_clusters.clusters) == 2
        assert "have endpoints again" in caplog.text
    finally:
        cp.stop()


def test_replace_exports_keeps_sources_rebuilds_changes_and_pushes_nothing_for_equal_ones() -> None:
    a = _export(subset_key="version", split={"v1": 95, "v2": 5})
    other = parse_export("o=direct:///127.0.0.1:2")
    cp = ControlPlane([a, other])
    cp.start()
    try:
        backends = (_b("10.0.0.1:1", version="v1"), _b("10.0.0.2:1", version="v2"))
        _feed(cp, "g", backends)
        resolver, snaps = cp._resolvers["g"], cp.stats["snapshots"]
        versions = {t: cp.snapshot.body(t, None).version for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT)}
        cp.replace_exports([_export(subset_key="version", split={"v2": 5, "v1": 95}), other])  # equal: nothing
        assert cp.stats["snapshots"] == snaps and cp._resolvers["g"] is resolver
        cp.replace_exports([_export(subset_key="version", split={"v1": 50, "v2": 50}), other])
        assert cp._resolvers["g"] is resolver and cp.endpoints("g") == backends  # same source, its list kept
        action = _route_action(cp, "g")
        assert [c.weight.value for c in action.weighted_clusters.clusters] == [50, 50]
        assert cp.snapshot.body(ENDPOINT, None).version == versions[ENDPOINT]  # assignments unchanged
        assert cp.snapshot.body(LISTENER, None).version == versions[LISTENER]
        cp.replace_exports([parse_export("g=direct:///127.0.0.1:3")])  # new source; 'o' removed
        assert cp._resolvers["g"] is not resolver and "o" not in cp.exports and "o" not in cp._resolvers
        assert "g/version=v1" not in cp.snapshot.names(CLUSTER)
        _feed(cp, "g", backends)  # an update from the old source's generation is dropped:
        old_gen = cp._generation["g"] - 1

        async def late() -> None:
            cp._update("g", (_b("10.9.9.9:1"),), old_gen)

        _loop.run(late(), 10)
        assert cp.endpoints("g") == backends
        cp.add_export(parse_export("n=direct:///127.0.0.1:4"))
        assert "n" in cp.exports
    finally:
        cp.stop()


def test_reloader_applies_changes_and_keeps_the_last_good_config(tmp_path: Path, caplog) -> None:
    path = tmp_path / "xds.toml"
    path.write_text('[exports.g]\ntarget = "direct:///127.0.0.1:1"\n')
    applied: list[Any] = []
    from waypost.xds import load_config

    r = ConfigReloader(path, lambda: load_config(path), applied.append)
    assert not r.check()  # unchanged
    path.write_text('[exports.g]\ntarget = "direct:///127.0.0.1:2"\n')
    assert r.check() and applied[-1].exports[0].target == "direct:///127.0.0.1:2"
    with caplog.at_level(logging.ERROR, logger="waypost.xds"):
        path.write_text('[exports.g]\ntarget = "direct:///127.0.0.1:3"\nsplit = {v1 = 1}\n')
        assert not r.check() and len(applied) == 1
        assert not r.check()  # the same bad file: one line, not one per look
    assert caplog.text.count("not reloaded") == 1 and "unknown subset 'v1'" in caplog.text
    r.request()  # SIGHUP: read even though it did not change
    path.write_text('[exports.g]\ntarget = "direct:///127.0.0.1:4"\n')
    assert r.check() and applied[-1].exports[0].target == "direct:///127.0.0.1:4"


def test_reload_of_a_quoted_weight_keeps_the_last_good_config_and_a_good_reload_is_info(tmp_path: Path,
                                                                                         caplog) -> None:
    """``split = { v1 = 90, v2 = "10" }`` is refused at a reload too: one ERROR line naming the export, the field
    and the value, the last good config kept; a reload that works is an INFO line (nothing went wrong)."""
    from waypost.xds import load_config

    path = tmp_path / "xds.toml"
    good = '[exports.canary]\ntarget = "direct:///127.0.0.1:1"\nsubset_key = "version"\n'
    path.write_text(good + "split = { v1 = 95, v2 = 5 }\n")
    applied: list[Any] = []
    r = ConfigReloader(path, lambda: load_config(path), applied.append)
    with caplog.at_level(logging.DEBUG, logger="waypost.xds"):
        path.write_text(good + 'split = { v1 = 90, v2 = "10" }\n')
        assert not r.check() and not applied
        path.write_text(good + "split = { v1 = 50, v2 = 50 }\n")
        assert r.check() and applied[-1].exports[0].split.weights == (("v1", 50), ("v2", 50))
    lines = [(rec.levelname, rec.getMessage()) for rec in caplog.records if "reloaded" in rec.getMessage()]
    assert [level for level, _ in lines] == ["ERROR", "INFO"], lines
    assert (f"{path}: export 'canary': split: v2: expected an integer from 0 to 1000000, got the string '10' "
            "(write v2 = 10, without quotes); the last good one stays") in lines[0][1], lines[0][1]
    assert lines[1][1] == f"xds: config {path} reloaded (the file changed)"


def test_the_canary_example_and_the_docs_example_load() -> None:
    from waypost.xds import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "xds" / "canary.toml")
    greeter, search = cfg.exports
    assert greeter.split is not None and greeter.split.weights == (("v1", 95), ("v2", 5))
    assert [r.to.weights if r.to else None for r in greeter.routes] == [(("v2", 1),), None, None]
    assert sorted(subset_clusters(search)) == ["search/version=v7", "search/version=v8,zone=eu-west-1a"]
    doc = (root / "docs" / "xds.md").read_text()
    section = doc[doc.index("## Traffic policy"):]
    example = section[section.index("```toml\n") + 8:]
    assert example[:example.index("```")] in (root / "examples" / "xds" / "canary.toml").read_text()
