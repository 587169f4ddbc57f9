"""EndpointSlices -> addresses (waypost.registries.kubernetes.slices) and the k8s:// target grammar: pure, no apiserver.

The apiserver-backed behaviour (list, watch, 410, restarts, auth) is in tests/kubernetes/test_k8s_resolver.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waypost.errors import InvalidTarget
from waypost.registries.kubernetes.slices import SERVICE_NAME_LABEL, ServiceSlices, slice_endpoints
from waypost.resolver.target import parse_target


def eps(*specs: Any) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        address, conditions = (spec, None) if isinstance(spec, str) else spec
        ep: dict[str, Any] = {"addresses": [address]}
        if conditions is not None:
            ep["conditions"] = conditions
        out.append(ep)
    return out


def make_slice(name: str, service: str, endpoints: list[dict[str, Any]], *, ports: Any = None,
               address_type: str = "IPv4") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {SERVICE_NAME_LABEL: service}, "resourceVersion": "1"},
            "addressType": address_type, "endpoints": endpoints,
            "ports": [{"name": "grpc", "port": 50051, "protocol": "TCP"}] if ports is None else ports}


def addresses(s: ServiceSlices) -> list[str]:
    return [e.address for e in s.endpoints()]


def test_ready_absent_counts_as_ready_and_terminating_never_counts():
    sl = make_slice("a", "greet", eps("10.0.0.1", ("10.0.0.2", {"ready": False}), ("10.0.0.3", {}),
                                      ("10.0.0.4", {"ready": True, "terminating": True}),
                                      ("10.0.0.5", {"ready": None, "serving": True})))
    assert [e.address for e in slice_endpoints(sl, "50051")] == ["10.0.0.1:50051", "10.0.0.3:50051",
                                                                  "10.0.0.5:50051"]


def test_named_and_numbered_ports_and_a_slice_without_ports():
    ports = [{"name": "http", "port": 8080}, {"name": "grpc", "port": 9090, "protocol": "TCP"},
             {"name": "dns", "port": 53, "protocol": "UDP"}]
    sl = make_slice("a", "greet", eps("10.0.0.1"), ports=ports)
    assert [e.address for e in slice_endpoints(sl, "grpc")] == ["10.0.0.1:9090"]
    assert [e.address for e in slice_endpoints(sl, "9090")] == ["10.0.0.1:9090"]
    assert slice_endpoints(sl, "dns") == []  # UDP is not dialed
    assert slice_endpoints(sl, "7000") == []  # no such port in this slice
    # ports null: "all ports" (a headless Service without ports): a number is used as is, a name cannot match
    bare = make_slice("b", "greet", eps("10.0.0.2"), ports=[])
    bare["ports"] = None
    assert [e.address for e in slice_endpoints(bare, "7000")] == ["10.0.0.2:7000"]
    assert slice_endpoints(bare, "grpc") == []


def test_ipv6_slices_are_bracketed_and_fqdn_slices_skipped():
    v6 = make_slice("v6", "greet", eps("fd00::1"), address_type="IPv6")
    fqdn = make_slice("f", "greet", eps("pod.example.com"), address_type="FQDN")
    s = ServiceSlices("greet", "grpc")
    s.replace([v6, fqdn, make_slice("v4", "greet", eps("10.0.0.1"))])
    assert addresses(s) == ["10.0.0.1:50051", "[fd00::1]:50051"]


def test_slices_merge_dedupe_and_follow_events():
    s = ServiceSlices("greet", "grpc")
    s.replace([make_slice("a", "greet", eps("10.0.0.1", "10.0.0.2")),
               make_slice("b", "greet", eps("10.0.0.2", "10.0.0.3")),
               make_slice("x", "other", eps("10.0.0.9"))])  # another service's slice is ignored
    assert addresses(s) == ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    s.apply("MODIFIED", make_slice("a", "greet", eps(("10.0.0.1", {"ready": False}))))
    assert addresses(s) == ["10.0.0.2:50051", "10.0.0.3:50051"]
    s.apply("DELETED", make_slice("b", "greet", []))
    assert addresses(s) == []
    s.apply("ADDED", make_slice("c", "greet", eps("10.0.0.4")))
    # a slice relabelled to another service leaves this one
    s.apply("MODIFIED", make_slice("c", "other", eps("10.0.0.4")))
    assert addresses(s) == [] and len(s) == 1


def test_endpoint_metadata_pod_node_zone():
    sl = make_slice("a", "greet", [{"addresses": ["10.0.0.1"], "nodeName": "n1", "zone": "z1",
                                    "targetRef": {"kind": "Pod", "name": "greet-7d9"}}])
    (ep,) = slice_endpoints(sl, "grpc")
    assert (ep.pod, ep.node, ep.zone) == ("greet-7d9", "n1", "z1")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
slice_like = st.fixed_dictionaries({
    "metadata": st.one_of(json_values, st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=5), "labels": st.just({SERVICE_NAME_LABEL: "greet"})})),
    "addressType": st.sampled_from(["IPv4", "IPv6", "FQDN", None, 3]),
    "endpoints": st.one_of(json_values, st.lists(st.fixed_dictionaries(
        {"addresses": st.one_of(json_values, st.lists(st.text(max_size=12), max_size=2)),
         "conditions": json_values}), max_size=4)),
    "ports": st.one_of(json_values, st.lists(st.fixed_dictionaries(
        {"name": st.sampled_from(["grpc", "http", None]), "port": json_values}), max_size=3)),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "x"]),
                          st.one_of(slice_like, json_values)), max_size=8),
       st.sampled_from(["grpc", "50051", "80"]))
def test_malformed_objects_never_raise(events, port):
    """Whatever the apiserver (or a broken proxy) sends, the resolver's state never raises: skipped."""
    s = ServiceSlices("greet", port)
    s.replace([obj for _, obj in events])
    for kind, obj in events:
        s.apply(kind, obj)
        for ep in s.endpoints():
            assert ep.address.rsplit(":", 1)[1].isdigit()


# ---- the target grammar ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, namespace, service, port", [
    ("k8s://prod/greet:50051", "prod", "greet", "50051"),  # go-zero's form
    ("k8s:///prod/greet:grpc", "prod", "greet", "grpc"),  # three slashes, a named port
    ("k8s:///greet:50051", "", "greet", "50051"),  # no namespace: the pod's, or the context's
    ("K8S://prod/greet:050051", "prod", "greet", "50051"),
])
def test_k8s_targets(text, namespace, service, port):
    t = parse_target(text)
    assert (t.scheme, t.authority, t.key, t.options["port"]) == ("k8s", namespace, service, port)
    assert not t.uses_registry


def test_k8s_target_options():
    t = parse_target("k8s://prod/greet:50051?kubeconfig=/etc/kube/config&context=staging")
    assert t.options["kubeconfig"] == "/etc/kube/config" and t.options["context"] == "staging"


@pytest.mark.parametrize("text, words", [
    ("k8s://prod/greet", ["missing the port", "k8s://prod/greet:50051"]),
    ("k8s://prod/greet:0", ["out of range"]),
    ("k8s://Prod/greet:1", ["namespace 'Prod' is not a Kubernetes name"]),
    ("k8s://prod/greet_svc:1", ["service 'greet_svc'"]),
    ("k8s://prod/greet:Grpc", ["port name 'Grpc'"]),
    ("k8s://prod/a/greet:1", ["namespace is given twice"]),
    ("k8s:///a/b/greet:1", ["unexpected path"]),
    ("k8s:///prod/a:1,b:2", ["exactly one service"]),
    ("k8s://prod/greet:1?ctx=x", ["unknown query parameter 'ctx'", "context"]),
    ("k8s://prod/greet:1?kubeconfig=", ["empty kubeconfig="]),
    ("k8s://user@prod/greet:1", ["take no credentials"]),
    ("k8s:greet:1", ["k8s targets are written k8s:///"]),
])
def test_malformed_k8s_targets_say_what_is_wrong(text, words):
    with pytest.raises(InvalidTarget) as e:
        parse_target(text)
    for w in words:
        assert w in str(e.value), str(e.value)
