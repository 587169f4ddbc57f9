"""The Kubernetes harness itself: a real kube-apiserver (harness/k8s/support.py), REST helpers, 410 on demand,
and scenarios in a private network namespace (harness/k8s/netns_host.py, harness/k8s/scenarios.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness.k8s import support as k8s_support
from harness.k8s.support import KubeApiError, KubeCluster

pytestmark = [k8s_support.timeout_mark()]


def _binary_or_skip(netns: bool):  # the netns_host fixture (tests/conftest.py) does the same
    reason = k8s_support.skip_reason(netns=netns)
    if reason:
        pytest.skip(reason)
    try:
        return k8s_support.apiserver_binary()  # outside any namespace: the build needs the network
    except k8s_support.K8sUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def cluster(tmp_path) -> Iterator[KubeCluster]:
    binary = _binary_or_skip(netns=False)
    c = KubeCluster(binary=binary, base_dir=tmp_path / "k8s").start()
    try:
        yield c
    finally:
        c.stop()


def test_pods_reachable_in_private_netns(netns_host):
    netns_host.run("pods_reachable", timeout=60)


def test_slices_round_trip_and_forced_410(cluster, tmp_path):
    ns = "harness"
    cluster.create_namespace(ns)
    cluster.create_service(ns, "echo")
    rv1 = cluster.put_slice(ns, "echo-1", "echo", endpoints=["192.0.2.10"])
    got = cluster.get(cluster.slice_path(ns, "echo-1"))
    assert got["metadata"]["resourceVersion"] == rv1
    assert got["metadata"]["labels"]["kubernetes.io/service-name"] == "echo"
    assert got["endpoints"] == [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}]
    assert got["ports"] == [{"name": "grpc", "port": 50051, "protocol": "TCP"}]

    # replace: a new resourceVersion and the new content
    rv2 = cluster.put_slice(ns, "echo-1", "echo", endpoints=[
        {"addresses": ["192.0.2.11"], "conditions": {"ready": False}}])
    assert int(rv2) > int(rv1)
    got = cluster.get(cluster.slice_path(ns, "echo-1"))
    assert got["endpoints"][0]["addresses"] == ["192.0.2.11"]
    assert got["endpoints"][0]["conditions"]["ready"] is False

    # a watch resumed from rv1 replays the change (no watch cache: served by etcd)
    status, events = cluster.raw_watch(cluster.slice_path(ns), rv1, max_events=1, timeout=10)
    assert status == 200 and events and events[0]["type"] == "MODIFIED", events
    assert events[0]["object"]["metadata"]["resourceVersion"] == rv2

    # RBAC: the reader may not list until granted
    with pytest.raises(KubeApiError) as e:
        cluster.get(cluster.slice_path(ns), token=k8s_support.READER_TOKEN)
    assert e.value.status == 403
    cluster.grant(ns, "reader")
    deadline = time.monotonic() + 10
    while True:
        try:
            cluster.get(cluster.slice_path(ns), token=k8s_support.READER_TOKEN)
            break
        except KubeApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    cluster.delete_slice(ns, "echo-1")
    with pytest.raises(KubeApiError) as e:
        cluster.get(cluster.slice_path(ns, "echo-1"))
    assert e.value.status == 404
    cluster.delete_slice(ns, "echo-1", missing_ok=True)
    listed = cluster.list_slices(ns, "echo")
    assert listed["items"] == []
    old_rv = listed["metadata"]["resourceVersion"]

    # 410 on demand: HTTP 200, then a single ERROR event with a Status of code 410, then the stream ends
    cluster.force_watch_gone()
    status, events = cluster.raw_watch(cluster.slice_path(ns), old_rv, max_events=2, timeout=10)
    assert status == 200, (status, events)
    assert len(events) == 1 and events[0]["type"] == "ERROR", events
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired", events
    # a fresh resourceVersion still watches normally
    fresh = cluster.list_slices(ns)["metadata"]["resourceVersion"]
    rv3 = cluster.put_slice(ns, "echo-2", "echo", endpoints=["192.0.2.12"])
    status, events = cluster.raw_watch(cluster.slice_path(ns), fresh, max_events=1, timeout=10)
    assert status == 200 and [e["type"] for e in events] == ["ADDED"], events
    assert events[0]["object"]["metadata"]["resourceVersion"] == rv3

    # kubeconfigs: token and client certificate (the apiserver accepts both)
    for kw in ({}, {"client_cert": True}, {"client_cert": True, "inline": True}):
        path = cluster.write_kubeconfig(tmp_path / f"kc-{len(kw)}.yaml", namespace=ns, **kw)
        assert path.read_text()
    status, body = cluster.request("GET", f"/api/v1/namespaces/{ns}", token=None, client_cert=True)
    assert status == 200, body
    status, _ = cluster.request("GET", f"/api/v1/namespaces/{ns}", token="wrong")
    assert status == 401
