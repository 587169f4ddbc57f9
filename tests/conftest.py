"""Shared fixtures: real etcd processes on free loopback ports, and registries over them."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from waypost.etcd.local import LocalEtcd

_ids = itertools.count()


@pytest.fixture
def etcd(tmp_path) -> Iterator[LocalEtcd]:
    """A fresh single-node etcd for one test (stop/start/pause/compact freely)."""
    node = LocalEtcd(1, base_dir=tmp_path / "etcd").start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def etcd_cluster(tmp_path) -> Iterator[LocalEtcd]:
    """A fresh 3-member etcd cluster for one test."""
    cluster = LocalEtcd(3, base_dir=tmp_path / "etcd3").start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def shared_etcd(tmp_path_factory) -> Iterator[LocalEtcd]:
    """One etcd for the whole session, for tests that do not disturb it (use a unique prefix)."""
    node = LocalEtcd(1, base_dir=tmp_path_factory.mktemp("shared-etcd")).start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def unique_key() -> str:
    """A key prefix no other test uses."""
    return f"t{os.getpid()}-{next(_ids)}.rpc"


@pytest.fixture(params=["memory", "etcd"])
def registry_url(request, tmp_path) -> Iterator[str]:
    """A registry URL for contract tests: a private in-process memory registry, or a fresh real etcd."""
    if request.param == "memory":
        yield f"memory://{request.node.name}-{next(_ids)}"
        return
    node = LocalEtcd(1, base_dir=tmp_path / "etcd").start()
    request.node.etcd = node  # tests that need to restart/compact reach it via request.node.etcd
    try:
        yield node.url()
    finally:
        node.close()


@pytest.fixture
def registry(registry_url):
    """A connected Registry (memory or etcd) for contract tests; closed afterwards."""
    import waypost
    from waypost import _loop

    reg = waypost.connect(registry_url)
    try:
        yield reg
    finally:
        _loop.run(reg.close(), 10)


@pytest.fixture(scope="session")
def netns_host(tmp_path_factory):
    """A process inside a private network namespace with a real kube-apiserver, running the scenarios of
    tests/k8s_scenarios.py (tests/k8s_support.NetnsHost). Skips, saying why, without Go, unshare or ip."""
    from tests import k8s_support

    reason = k8s_support.skip_reason(netns=True)
    if reason:
        pytest.skip(reason)
    try:
        binary = k8s_support.apiserver_binary()  # outside the namespace: the build needs the network
    except k8s_support.K8sUnavailable as e:
        pytest.skip(str(e))
    host = k8s_support.NetnsHost(binary=binary, log_dir=tmp_path_factory.mktemp("netns-host"))
    host.start()
    try:
        yield host
    finally:
        host.stop()
