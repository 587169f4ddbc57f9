"""Unit tests of the xDS resource builders, the snapshot bytes and versions, and the per-stream
version/nonce/ACK/NACK state machine (no network)."""

from __future__ import annotations

import gc
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import DecodeError

from waypost import ConfigWarning
from waypost.types import Backend
from waypost.xds import XdsConfigError, bootstrap, gc_scale, parse_export
from waypost.xds.control import ControlPlane
from waypost.xds.request import Request, parse
from waypost.xds.resources import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    cluster,
    listener,
    load_assignment,
    route_config,
    static_resources,
)
from waypost.xds.snapshot import Resource, Snapshot
from waypost.xds.stream import StreamState


def _b(addr: str, **meta) -> Backend:
    return Backend(addr, meta)


def _snapshot(exports, lists) -> Snapshot:
    per_type = {t: {} for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT)}
    for e in exports:
        for t, m in static_resources(e).items():
            per_type[t][e.name] = Resource.of(e.name, m)
        if e.name in lists:
            per_type[ENDPOINT][e.name] = Resource.of(e.name, load_assignment(e, lists[e.name]))
    return Snapshot(per_type)


def _resp(data: bytes) -> discovery_pb2.DiscoveryResponse:
    return discovery_pb2.DiscoveryResponse.FromString(data)


# ------------------------------------------------------------------------------------------ builders


def test_listener_routes_over_ads_with_the_router_filter() -> None:
    lis = listener(parse_export("greeter=direct:///127.0.0.1:1"))
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    assert lis.name == "greeter" and hcm.rds.route_config_name == "greeter"
    assert hcm.rds.config_source.HasField("ads")
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]


def test_route_carries_retries_and_hash_policy() -> None:
    e = parse_export("g=direct:///127.0.0.1:1 policy=ring_hash hash_header=X-User retries=3 "
                     "retry_on=unavailable,resource_exhausted")
    rc = route_config(e)
    (vh,) = rc.virtual_hosts
    assert list(vh.domains) == ["*"]
    action = vh.routes[0].route
    assert action.cluster == "g" and vh.routes[0].match.prefix == ""
    assert not action.HasField("max_stream_duration")  # never sent: grpcio misapplies it
    assert action.retry_policy.num_retries.value == 3
    assert action.retry_policy.retry_on == "unavailable,resource-exhausted"
    assert [h.header.header_name for h in action.hash_policy] == ["x-user"]
    plain = route_config(parse_export("g=direct:///127.0.0.1:1")).virtual_hosts[0].routes[0].route
    assert not plain.HasField("retry_policy") and not plain.hash_policy and not plain.HasField("max_stream_duration")


def _policy_names(c) -> list[str]:
    return [p.typed_extension_config.name.rsplit(".", 1)[1] for p in c.load_balancing_policy.policies]


def test_cluster_policies() -> None:
    rr = cluster(parse_export("g=direct:///127.0.0.1:1"))
    assert rr.type == rr.EDS and rr.eds_cluster_config.eds_config.HasField("ads")
    assert _policy_names(rr) == ["wrr_locality"]
    wrr = wrr_locality_pb2.WrrLocality()
    rr.load_balancing_policy.policies[0].typed_extension_config.typed_config.Unpack(wrr)
    assert [p.typed_extension_config.name for p in wrr.endpoint_picking_policy.policies] == [
        "envoy.load_balancing_policies.round_robin"]
    assert _policy_names(cluster(parse_export("g=direct:///127.0.0.1:1 policy=consistent_hash"))) == ["ring_hash"]
    lr = cluster(parse_export("g=direct:///127.0.0.1:1 policy=least_request"))
    lr.load_balancing_policy.policies[0].typed_extension_config.typed_config.Unpack(wrr)
    assert [p.typed_extension_config.name.rsplit(".", 1)[1] for p in wrr.endpoint_picking_policy.policies] == [
        "least_request", "round_robin"]  # grpcio rejects least_request alone
    # gRPC's A58 policy is weighted_round_robin in a service config (and in waypost), client_side_... in xDS
    a58 = cluster(parse_export("g=direct:///127.0.0.1:1 policy=weighted_round_robin"))
    assert a58.load_balancing_policy == cluster(
        parse_export("g=direct:///127.0.0.1:1 policy=client_side_weighted_round_robin")).load_balancing_policy
    with pytest.raises(XdsConfigError, match="smooth_weighted_round_robin' runs only in waypost's own channel"):
        parse_export("g=direct:///127.0.0.1:1 policy=smooth_weighted_round_robin")


def test_client_side_wrr_never_sends_a_zero_blackout() -> None:
    def blackout(cfg: dict) -> int:
        e = ControlPlaneless(cfg)
        wrr = wrr_locality_pb2.WrrLocality()
        cluster(e).load_balancing_policy.policies[0].typed_extension_config.typed_config.Unpack(wrr)
        msg = cswrr_pb2.ClientSideWeightedRoundRobin()
        wrr.endpoint_picking_policy.policies[0].typed_extension_config.typed_config.Unpack(msg)
        return msg.blackout_period.ToNanoseconds()

    assert blackout({}) == 1_000_000_000
    assert blackout({"blackoutPeriod": "0s"}) == 1
    assert blackout({"blackoutPeriod": "2s"}) == 2_000_000_000


def ControlPlaneless(policy_config: dict):
    from waypost.xds.exports import make_export

    return make_export("g", "direct:///127.0.0.1:1",
                       {"policy": "client_side_weighted_round_robin", "policy_config": policy_config})


def test_outlier_detection_maps_and_leaves_unset_kinds_off() -> None:
    from waypost.xds.exports import make_export

    e = make_export("g", "direct:///127.0.0.1:1", {"outlier_detection": {
        "interval": "5s", "failurePercentageEjection": {"threshold": 50, "minimumHosts": 2}}})
    od = cluster(e).outlier_detection
    assert od.interval.ToNanoseconds() == 5_000_000_000
    assert od.enforcing_success_rate.value == 0  # left out: off (gRPC's default would be 100)
    assert od.failure_percentage_threshold.value == 50 and od.failure_percentage_minimum_hosts.value == 2
    assert od.enforcing_failure_percentage.value == 100


def test_assignment_weights_drain_localities_and_priorities() -> None:
    e = parse_export("g=direct:///127.0.0.1:1 prefer=zone:a")
    cla = load_assignment(e, [
        _b("10.0.0.3:80", zone="b", weight=0),
        _b("10.0.0.1:80", zone="a", weight=5),
        _b("10.0.0.2:80", zone="b"),
        _b("[::1]:81", zone="b", weight="7"),
        _b("not-an-address"),
        _b("localhost:80"),  # a host name: grpcio would reject the whole assignment
    ])
    by_zone = {(loc.locality.zone, loc.locality.sub_zone): loc for loc in cla.endpoints}
    # zone b holds two weights (100 and 7): round_robin spreads evenly inside a locality, so each weight gets a
    # sub-zone of its own and the locality weights carry the split; the drained one joins the first
    assert set(by_zone) == {("a", ""), ("b", "weight-100"), ("b", "weight-7")}
    assert by_zone["a", ""].priority == 0 and by_zone["b", "weight-100"].priority == by_zone["b", "weight-7"].priority == 1
    assert by_zone["a", ""].load_balancing_weight.value == 5
    assert by_zone["b", "weight-100"].load_balancing_weight.value == 100  # the drained one counts 0
    assert by_zone["b", "weight-7"].load_balancing_weight.value == 7
    assert [ep.endpoint.address.socket_address.address for ep in by_zone["b", "weight-100"].lb_endpoints] == [
        "10.0.0.2", "10.0.0.3"]
    eps = {ep.endpoint.address.socket_address.address: ep for loc in cla.endpoints for ep in loc.lb_endpoints}
    assert set(eps) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "::1"}
    assert eps["10.0.0.3"].health_status == health_check_pb2.DRAINING
    assert eps["10.0.0.2"].health_status == health_check_pb2.HEALTHY
    assert eps["::1"].load_balancing_weight.value == 7 and eps["::1"].endpoint.address.socket_address.port_value == 81
    # no preference, or a zone nobody is in: one priority (no gap)
    assert {loc.priority for loc in load_assignment(parse_export("g=direct:///127.0.0.1:1 prefer=zone:z"),
                                                    [_b("10.0.0.1:1", zone="a"), _b("10.0.0.2:1")]).endpoints} == {0}


def _localities(spec: str, weights: list[object]) -> list[tuple[str, int, list[int]]]:
    cla = load_assignment(parse_export(spec), [_b(f"10.0.0.{i + 1}:80", zone="z", weight=w)
                                               for i, w in enumerate(weights)])
    return [(loc.locality.sub_zone, loc.load_balancing_weight.value, [ep.load_balancing_weight.value
                                                                      for ep in loc.lb_endpoints])
            for loc in cla.endpoints]


@pytest.mark.parametrize("policy", ["round_robin", "pick_first", "least_request"])
def test_distinct_weights_in_one_zone_become_weighted_sub_zones(policy: str) -> None:
    assert _localities(f"g=direct:///127.0.0.1:1 policy={policy}", [10, 30, 60, 30]) == [
        ("weight-60", 60, [60]), ("weight-30", 60, [30, 30]), ("weight-10", 10, [10])]


@pytest.mark.parametrize("policy", ["ring_hash", "client_side_weighted_round_robin"])
def test_policies_weighing_endpoints_themselves_keep_one_locality(policy: str) -> None:
    assert _localities(f"g=direct:///127.0.0.1:1 policy={policy}", [10, 30, 60]) == [("", 100, [10, 30, 60])]


def test_equal_weights_give_the_resources_of_a_fleet_without_weights() -> None:
    """No churn for fleets without weights: equal weights (given or the default), with drained ones among
    them, build exactly the bytes they built before sub-zones existed (one locality, no sub_zone)."""
    e = parse_export("g=direct:///127.0.0.1:1")
    plain = load_assignment(e, [_b("10.0.0.1:80"), _b("10.0.0.2:80"), _b("10.0.0.3:80", weight=0)])
    assert [loc.locality.sub_zone for loc in plain.endpoints] == [""]
    same = load_assignment(e, [_b("10.0.0.1:80", weight=100), _b("10.0.0.2:80", weight="100"),
                               _b("10.0.0.3:80", weight=0)])
    assert same.SerializeToString(deterministic=True) == plain.SerializeToString(deterministic=True)
    assert _localities("g=direct:///127.0.0.1:1", [20, 20]) == [("", 40, [20, 20])]


def test_every_locality_has_a_weight_even_when_all_drained() -> None:
    cla = load_assignment(parse_export("g=direct:///127.0.0.1:1"), [_b("10.0.0.1:1", weight=0)])
    assert cla.endpoints[0].load_balancing_weight.value >= 1


def test_resources_are_deterministic_across_replicas() -> None:
    e = parse_export("g=direct:///127.0.0.1:1")
    a = _snapshot([e], {"g": [_b("10.0.0.2:1", zone="x"), _b("10.0.0.1:1")]})
    b = _snapshot([parse_export("g=direct:///127.0.0.1:1")], {"g": [_b("10.0.0.1:1"), _b("10.0.0.2:1", zone="x")]})
    for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT):
        assert a.body(t, None).data == b.body(t, None).data
    assert a.body(ENDPOINT, frozenset({"g"})).version == b.body(ENDPOINT, frozenset({"g"})).version


def test_body_bytes_parse_as_a_discovery_response() -> None:
    snap = _snapshot([parse_export("g=direct:///127.0.0.1:1")], {"g": [_b("10.0.0.1:1")]})
    body = snap.body(ENDPOINT, frozenset({"g", "other"}))
    r = _resp(body.response)
    assert r.nonce == body.nonce and r.type_url == ENDPOINT and len(r.resources) == 1 and r.version_info
    assert snap.body(ENDPOINT, frozenset({"other"})) is None


# ------------------------------------------------------------------------------------------ state machine


def _req(t: str, names=(), version="", nonce="", error: str | None = None, node: str | None = None):
    r = discovery_pb2.DiscoveryRequest(type_url=t, resource_names=list(names), version_info=version,
                                       response_nonce=nonce)
    if error is not None:
        r.error_detail.message = error
    if node is not None:
        r.node.CopyFrom(base_pb2.Node(id=node))
    return Request.of(r)


def test_initial_ack_nack_stale_and_node() -> None:
    e = parse_export("g=direct:///127.0.0.1:1")
    s1 = _snapshot([e], {"g": [_b("10.0.0.1:1")]})
    st = StreamState("peer")
    out = st.on_request(_req(CLUSTER, node="n1"), s1)  # wildcard
    assert out.kind == "initial" and st.node_id == "n1" and len(out.responses) == 1
    r1 = _resp(out.responses[0][1])
    out = st.on_request(_req(CLUSTER, version=r1.version_info, nonce=r1.nonce), s1)  # ACK, nothing new
    assert out.kind == "ack" and out.responses == [] and st.types[CLUSTER].acked_version == r1.version_info
    # a new snapshot with another Cluster: pushed; a NACK of it keeps the acked version and is not resent
    s2 = _snapshot([parse_export("g=direct:///127.0.0.1:1 policy=pick_first")], {})
    (pushed,) = st.on_snapshot(s2)
    r2 = _resp(pushed[1])
    assert r2.version_info != r1.version_info and int(r2.nonce) > int(r1.nonce)
    out = st.on_request(_req(CLUSTER, version=r1.version_info, nonce=r2.nonce, error="bad cluster"), s2)
    assert out.kind == "nack" and out.error == "bad cluster" and out.responses == []
    assert st.types[CLUSTER].acked_version == r1.version_info and st.types[CLUSTER].nacks == 1
    assert st.on_snapshot(s2) == []  # the rejected version is not sent again
    assert st.node_id == "n1"  # later requests without node keep it
    # a stale nonce (an older response) is ignored
    assert st.on_request(_req(CLUSTER, nonce=r1.nonce), s1).kind == "stale"
    # the next change is sent
    assert len(st.on_snapshot(s1)) == 1


def test_streams_with_one_subscription_share_one_response_and_nonces_still_tell_responses_apart() -> None:
    e = parse_export("g=direct:///127.0.0.1:1")
    s1, s2 = _snapshot([e], {"g": [_b("10.0.0.1:1")]}), _snapshot([e], {"g": [_b("10.0.0.2:1")]})
    a, b = StreamState("a"), StreamState("b")
    (ra,) = a.on_request(_req(ENDPOINT, ["g"]), s1).responses
    (rb,) = b.on_request(_req(ENDPOINT, ["g"]), s1).responses
    assert ra[1] is rb[1]  # one response serialized, its bytes shared by both streams
    first = _resp(ra[1])
    (pa,) = a.on_snapshot(s2, {ENDPOINT: {"g"}})
    (pb,) = b.on_snapshot(s2, {ENDPOINT: {"g"}})
    assert pa[1] is pb[1] and int(_resp(pa[1]).nonce) > int(first.nonce)
    # an ACK of the first response is now stale on both streams; the ACK of the new one is an ACK
    assert a.on_request(_req(ENDPOINT, ["g"], first.version_info, first.nonce), s2).kind == "stale"
    second = _resp(pb[1])
    assert b.on_request(_req(ENDPOINT, ["g"], second.version_info, second.nonce), s2).kind == "ack"
    assert b.types[ENDPOINT].acked_version == second.version_info


def test_a_subscription_back_to_earlier_names_gets_the_earlier_response_again() -> None:
    snap = _snapshot([parse_export("a=direct:///127.0.0.1:1"), parse_export("b=direct:///127.0.0.1:2")],
                     {"a": [_b("10.0.0.1:1")], "b": [_b("10.0.0.2:1")]})
    st = StreamState()
    (r1,) = st.on_request(_req(ENDPOINT, ["a"]), snap).responses
    one = _resp(r1[1])
    (r2,) = st.on_request(_req(ENDPOINT, ["a", "b"], one.version_info, one.nonce), snap).responses
    two = _resp(r2[1])
    assert st.on_request(_req(ENDPOINT, ["a"], one.version_info, one.nonce), snap).kind == "stale"
    (r3,) = st.on_request(_req(ENDPOINT, ["a"], two.version_info, two.nonce), snap).responses
    assert r3[1] == r1[1]  # the same response (A, B, A): only requests carrying B's nonce can follow B
    assert st.on_request(_req(ENDPOINT, ["a"], one.version_info, one.nonce), snap).kind == "ack"
    assert st.types[ENDPOINT].acked_version == one.version_info


def test_the_young_collection_threshold_grows_with_open_streams_and_is_put_back() -> None:
    before = gc.get_threshold()
    try:
        for _ in range(1000):
            gc_scale.opened()
        assert gc.get_threshold()[0] >= 1000 * gc_scale.OBJECTS_PER_STREAM
        assert gc.get_threshold()[1:] == before[1:]  # older generations keep theirs
        for _ in range(1000):
            gc_scale.closed()
        # back where it was (other tests' servers in this process may hold a few streams still)
        assert 0 < gc.get_threshold()[0] < 100 * gc_scale.OBJECTS_PER_STREAM
    finally:
        gc.set_threshold(*before)


def test_equal_requests_are_parsed_once_and_a_first_request_with_its_node_is_not_kept() -> None:
    ack = discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["g"], version_info="v", response_nonce="7")
    one, two = parse(ack.SerializeToString()), parse(ack.SerializeToString())
    assert one is two and one.names == frozenset({"g"}) and one.error is None and one.node is None
    nack = discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, response_nonce="7")
    nack.error_detail.message = ""
    assert parse(nack.SerializeToString()).error == ""  # an error_detail, even empty, makes a NACK
    first = discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["g"])
    first.node.id = "n1"
    a, b = parse(first.SerializeToString()), parse(first.SerializeToString())
    assert a is not b and a.node is not None and a.node.id == "n1"
    with pytest.raises(DecodeError):
        parse(b"\xff\xff\xff")


def test_named_subscriptions_and_names_not_exported(caplog) -> None:
    snap = _snapshot([parse_export("a=direct:///127.0.0.1:1"), parse_export("b=direct:///127.0.0.1:2")],
                     {"a": [_b("10.0.0.1:1")]})
    st = StreamState()
    out = st.on_request(_req(LISTENER, ["a", "zz"]), snap)
    listed = _resp(out.responses[0][1])
    assert sorted(_listener(r).name for r in listed.resources) == ["a", "zz"]  # zz: the not-exported Listener
    st.on_request(_req(LISTENER, ["a", "zz"], listed.version_info, listed.nonce), snap)
    assert sum("not exported" in r.getMessage() for r in caplog.records) == 1  # once per stream
    # EDS of a service whose source has not answered: nothing sent (no empty response)
    assert st.on_request(_req(ENDPOINT, ["b"]), snap).responses == []
    # an unsubscribe (empty names for EDS) sends nothing
    assert st.on_request(_req(ENDPOINT, []), snap).responses == []
    # an unknown type is ignored
    assert st.on_request(_req("type.googleapis.com/x.Y"), snap).kind == "unknown"


def test_subset_clusters_and_waiting_assignments_are_served_names_and_a_typo_is_not(caplog) -> None:
    """A canary's subset clusters (``canary/version=v1``) and the assignments of clusters whose endpoints are not
    known yet are names this control plane serves: subscribing to them logs nothing. A name it does not serve is
    logged once per stream, with the exported names and the closest served name of its type."""
    from waypost.xds.exports import parse_config
    from waypost.xds.resources import subset_clusters

    (canary,) = parse_config('[exports.canary]\ntarget = "direct:///127.0.0.1:1"\nsubset_key = "version"\n'
                             'split = { v1 = 90, v2 = 10 }\n').exports
    snap = _snapshot([canary], {})
    snap.resources[CLUSTER].update({n: Resource.of(n, c) for n, c in subset_clusters(canary).items()})
    st = StreamState()
    subsets = ["canary", "canary/version=v1", "canary/version=v2"]
    st.on_request(_req(CLUSTER, subsets), snap)
    st.on_request(_req(ENDPOINT, subsets), snap)  # no endpoints known yet: waiting, not unknown
    st.on_request(_req(LISTENER, ["canary"]), snap)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    st.on_request(_req(CLUSTER, [*subsets, "canary/version=v3"]), snap)
    st.on_request(_req(ENDPOINT, [*subsets, "canary/version=v3"]), snap)
    st.on_request(_req(LISTENER, ["canray"]), snap)
    st.on_request(_req(LISTENER, ["canray", "zzz"]), snap)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 4, warned  # once per (type, name) per stream
    cds, eds, lds, far = warned
    assert "CDS 'canary/version=v3', which is not exported (exported: canary); did you mean 'canary/version=v2'?" \
        in cds and "answered without it" in cds
    assert "EDS 'canary/version=v3'" in eds and "did you mean 'canary/version=v2'?" in eds
    assert "LDS 'canray', which is not exported (exported: canary); did you mean 'canary'?" in lds
    assert "LDS 'zzz'" in far and "did you mean" not in far


def _listener(any_msg):
    from envoy.config.listener.v3 import listener_pb2

    lis = listener_pb2.Listener()
    any_msg.Unpack(lis)
    return lis


def test_an_unknown_listener_is_answered_with_one_that_fails_calls_until_exported() -> None:
    """A stream subscribed only to a name not exported gets a response at once (a Listener whose inline route
    config has no virtual host: the client fails its calls at once); exported later, the real one is pushed."""
    e = parse_export("a=direct:///127.0.0.1:1")
    before = _snapshot([e], {})
    st = StreamState()
    (resp,) = st.on_request(_req(LISTENER, ["late"]), before).responses
    r = _resp(resp[1])
    (lis,) = (_listener(x) for x in r.resources)
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    assert lis.name == "late" and r.version_info and hcm.HasField("route_config")
    assert not hcm.route_config.virtual_hosts and [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    st.on_request(_req(LISTENER, ["late"], r.version_info, r.nonce), before)  # ACK
    assert st.on_snapshot(before) == []  # nothing new
    after = _snapshot([e, parse_export("late=direct:///127.0.0.1:2")], {})
    (pushed,) = st.on_snapshot(after)
    p = _resp(pushed[1])
    hcm = hcm_pb2.HttpConnectionManager()
    _listener(p.resources[0]).api_listener.api_listener.Unpack(hcm)
    assert p.version_info != r.version_info and hcm.rds.route_config_name == "late"
    # replicas answer the same name with the same bytes and version
    again = StreamState().on_request(_req(LISTENER, ["late"]), _snapshot([e], {})).responses[0][1]
    assert _resp(again).version_info == r.version_info


def test_an_unknown_cluster_gets_a_response_without_it() -> None:
    """CDS is a full-state type: a response without a subscribed name says it does not exist, so one is sent even
    when it carries nothing; the version covers the names left out."""
    snap = _snapshot([parse_export("a=direct:///127.0.0.1:1")], {})
    st = StreamState()
    (resp,) = st.on_request(_req(CLUSTER, ["nope"]), snap).responses
    r = _resp(resp[1])
    assert not r.resources and r.version_info and r.type_url == CLUSTER
    (resp2,) = st.on_request(_req(CLUSTER, ["nope", "a"], r.version_info, r.nonce), snap).responses
    r2 = _resp(resp2[1])
    assert [x.type_url for x in r2.resources] == [CLUSTER] and r2.version_info != r.version_info
    (resp3,) = st.on_request(_req(CLUSTER, ["nope", "a", "other"], r2.version_info, r2.nonce), snap).responses
    assert len(_resp(resp3[1]).resources) == 1 and _resp(resp3[1]).version_info != r2.version_info


# ------------------------------------------------------------------------------------------ control plane rules


def test_empty_lists_never_replace_endpoints() -> None:
    e = parse_export("g=direct:///127.0.0.1:1")
    cp = ControlPlane([e])
    cp._static["g"] = {t: Resource.of("g", m) for t, m in static_resources(e).items()}
    cp._mark = lambda: cp._rebuild()  # type: ignore[method-assign]  # no loop needed here
    cp._update("g", ())
    assert cp.endpoints("g") == () and ENDPOINT in cp.snapshot.resources and "g" in cp.snapshot.names(ENDPOINT)
    cp._update("g", (_b("10.0.0.1:1"),))
    version = cp.snapshot.body(ENDPOINT, None).version
    cp._update("g", ())  # an outage or an empty answer: the last list stays
    assert cp.endpoints("g") == (_b("10.0.0.1:1"),) and cp.snapshot.body(ENDPOINT, None).version == version
    cp._update("g", (_b("host.example:1"),))  # nothing usable (a host name): the last list stays too
    assert cp.endpoints("g") == (_b("10.0.0.1:1"),) and cp.snapshot.body(ENDPOINT, None).version == version
    quiet = ControlPlane([parse_export("q=direct:///127.0.0.1:1 serve_empty=false")])
    quiet._mark = lambda: quiet._rebuild()  # type: ignore[method-assign]
    quiet._update("q", ())
    assert "q" not in quiet.snapshot.names(ENDPOINT)


def test_bootstrap_lists_every_server_with_features() -> None:
    doc = bootstrap(["10.0.0.1:18000", "10.0.0.2:18000"], "n", zone="z1")
    assert [s["server_uri"] for s in doc["xds_servers"]] == ["10.0.0.1:18000", "10.0.0.2:18000"]
    assert all(s["server_features"] == ["xds_v3", "ignore_resource_deletion"] for s in doc["xds_servers"])
    assert doc["node"] == {"id": "n", "cluster": "waypost", "locality": {"zone": "z1"}}
    json.dumps(doc)
    with pytest.raises(ValueError, match="HOST:PORT"):
        bootstrap(["nocolon"])


def test_waypost_only_policies_are_refused_naming_the_served_ones() -> None:
    with pytest.raises(XdsConfigError, match="peak_ewma.*only in waypost.*round_robin, pick_first, ring_hash"):
        parse_export("g=direct:///127.0.0.1:1 policy=peak_ewma")
    with pytest.raises(XdsConfigError, match="unknown policy 'nope'"):
        parse_export("g=direct:///127.0.0.1:1 policy=nope")
    with pytest.raises(XdsConfigError, match="hash_header needs policy ring_hash"):
        parse_export("g=direct:///127.0.0.1:1 hash_header=x-user")


def test_service_config_becomes_routes_in_grpc_precedence() -> None:
    from waypost.xds.exports import make_export

    sc = {"methodConfig": [
        {"name": [{"service": "a.S"}], "timeout": "1s"},
        {"name": [{"service": "a.S", "method": "M"}], "timeout": "0.5s",
         "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                         "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}},
        {"name": [{}], "timeout": "9s"},
    ]}
    e = make_export("g", "direct:///127.0.0.1:1", {"service_config": sc})
    routes = route_config(e).virtual_hosts[0].routes
    assert [(r.match.path, r.match.prefix) for r in routes] == [("/a.S/M", ""), ("", "/a.S/"), ("", "")]
    assert not any(r.route.HasField("max_stream_duration") for r in routes)  # timeouts are not sent
    rp = routes[0].route.retry_policy
    assert rp.num_retries.value == 2 and rp.retry_on == "resource-exhausted,unavailable"
    assert rp.retry_back_off.base_interval.ToNanoseconds() == 100_000_000
    assert not routes[1].route.HasField("retry_policy")
    with pytest.raises(XdsConfigError, match="honour only.*not ABORTED"), pytest.warns(ConfigWarning):
        make_export("g", "direct:///127.0.0.1:1", {"service_config": {"methodConfig": [{"name": [{}], "retryPolicy": {
            "maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["ABORTED"]}}]}})
    with pytest.raises(XdsConfigError, match="only methodConfig"):
        make_export("g", "direct:///127.0.0.1:1", {"service_config": {"loadBalancingConfig": [{"round_robin": {}}]}})
    with pytest.raises(XdsConfigError, match="either in service_config"):
        make_export("g", "direct:///127.0.0.1:1", {"service_config": sc, "retries": 2})
    assert parse_export('g=direct:///127.0.0.1:1 service_config={"methodConfig":[{"name":[{}],"timeout":"2s"}]}')


_meta_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(allow_nan=True),
                         st.text(max_size=12), st.binary(max_size=6))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.sampled_from(["10.0.0.1:80", "[::1]:81", "h:1", "x", ":80", "10.0.0.2:99999", "a:b"]),
              st.text(max_size=20)),
    st.dictionaries(st.sampled_from(["weight", "zone", "region", "other"]), _meta_values, max_size=4)),
    max_size=12), st.sampled_from([None, "zone:a", "region:r"]))
def test_fuzz_assignments_are_always_valid(items, prefer) -> None:
    """Whatever the registrations hold, the assignment builds, and every locality has a weight >= 1 and every
    endpoint a weight >= 1 (gRPC drops or rejects the others); priorities have no gap."""
    spec = "g=direct:///127.0.0.1:1" + (f" prefer={prefer}" if prefer else "")
    cla = load_assignment(parse_export(spec), [Backend(a, m) for a, m in items])
    assert all(loc.load_balancing_weight.value >= 1 for loc in cla.endpoints)
    assert all(ep.load_balancing_weight.value >= 1 for loc in cla.endpoints for ep in loc.lb_endpoints)
    priorities = sorted({loc.priority for loc in cla.endpoints})
    assert priorities == list(range(len(priorities)))
    for loc in cla.endpoints:  # a sub-zone holds one serving weight, and its weight is their sum
        serving = [ep.load_balancing_weight.value for ep in loc.lb_endpoints if ep.health_status != health_check_pb2.DRAINING]
        if loc.locality.sub_zone:
            assert len(set(serving)) == 1 and loc.locality.sub_zone == f"weight-{serving[0]}"
        assert loc.load_balancing_weight.value == max(sum(serving), 1)
    cla.SerializeToString()
