"""Shared fixtures: real etcd processes on free loopback ports, and registries over them; and the grouping of
tests for parallel runs (pytest-xdist, ``-n 2 --dist loadgroup``, see ``pytest_collection_modifyitems``)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import pytest

from harness import proc_reaper
from waypost.etcd.local import LocalEtcd

_ids = itertools.count()


@contextlib.contextmanager
def _reaped(node: LocalEtcd) -> Iterator[LocalEtcd]:
    """``node``, closed at the end of the block, or by the test reaper if the run is killed first."""
    proc_reaper.track(node, node.close)
    try:
        yield node
    finally:
        proc_reaper.untrack(node)
        node.close()


@pytest.fixture
def etcd(tmp_path) -> Iterator[LocalEtcd]:
    """A fresh single-node etcd for one test (stop/start/pause/compact freely)."""
    with _reaped(LocalEtcd(1, base_dir=tmp_path / "etcd").start()) as node:
        yield node


@pytest.fixture
def etcd_cluster(tmp_path) -> Iterator[LocalEtcd]:
    """A fresh 3-member etcd cluster for one test."""
    with _reaped(LocalEtcd(3, base_dir=tmp_path / "etcd3").start()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def shared_etcd(tmp_path_factory) -> Iterator[LocalEtcd]:
    """One etcd for the whole session, for tests that do not disturb it (use a unique prefix)."""
    with _reaped(LocalEtcd(1, base_dir=tmp_path_factory.mktemp("shared-etcd")).start()) as node:
        yield node


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
    with _reaped(LocalEtcd(1, base_dir=tmp_path / "etcd").start()) as node:
        request.node.etcd = node  # tests that need to restart/compact reach it via request.node.etcd
        yield node.url()


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
    harness/k8s/scenarios.py (tests/k8s_support.NetnsHost). Skips, saying why, without Go, unshare or ip."""
    from harness.k8s import support as k8s_support

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


# ---- parallel runs (pytest-xdist) ----------------------------------------------------------------------------------

#: session fixtures too costly to start once per worker: every test using one runs on the same worker
_SHARED_SESSION_FIXTURES = {
    "netns_host": "k8s-netns",  # a kube-apiserver (and its etcd) in a private network namespace
    # the Go interop programs: on a cold cache one worker builds them (minutes) and another would only wait on
    # the build lock; grouped, the other worker goes on with the rest of the suite meanwhile
    "go_bins": "go-interop",
}
_NARROW_SCOPES = ("module", "package", "class")


def xdist_group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` a test joins under ``--dist loadgroup``, or None (it goes to any free worker).

    Each xdist worker sets up its own copy of every fixture wider than a function. Tests that share a costly
    session fixture (``_SHARED_SESSION_FIXTURES``) are grouped on one worker so that it starts once per run, not
    once per worker; tests that share a module- or class-scoped fixture (a Consul agent, a ZooKeeper server, an xDS
    setup) are grouped by module (and by that fixture's parameter, when it has one) so that it starts once, as in a
    serial run. A group named by an explicit ``xdist_group`` mark wins. Everything else is spread test by test.
    """
    if item.get_closest_marker("xdist_group") is not None:
        return None
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    narrow: list[str] = []
    for name in item.fixturenames:
        if name in _SHARED_SESSION_FIXTURES:
            return _SHARED_SESSION_FIXTURES[name]
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in _NARROW_SCOPES:
            narrow.append(name)
    if not narrow:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    suffix = "".join(f",{name}={params[name]}" for name in sorted(narrow) if name in params)
    # the module's path from the root, not its file name: test files of different folders may share a name.
    # xdist reads the group after the last "@" of the test id, and only when no "]" follows it
    module = item.nodeid.split("::", 1)[0]
    return f"{module}{suffix}".replace("@", "_").replace("]", "_")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
