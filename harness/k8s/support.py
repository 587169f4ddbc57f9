"""Kubernetes test harness: a real kube-apiserver (built from source once, cached) over a real etcd, and
scenarios run in a private network namespace. The pieces, one job per module, are all importable from here:

* harness/k8s/build.py: ``apiserver_binary()`` builds kube-apiserver once (cached, locked, bounded);
  ``timeout_mark()`` is the per-test bound allowing for a cold build.
* harness/k8s/cluster.py: ``KubeCluster``, etcd + kube-apiserver on free ports (and why each apiserver flag).
* harness/k8s/api.py: the REST helpers (``KubeApi``: requests, raw watches, namespaces, Services,
  EndpointSlices, RBAC grants), ``KubeApiError``, ``ADMIN_TOKEN`` and ``READER_TOKEN``.
* harness/k8s/kubeconfig.py: kubeconfig writing; harness/k8s/pki.py: the certificates and the token file.
* harness/k8s/netns.py: ``NetnsHost`` (scenarios of harness/k8s/scenarios.py inside a private network namespace,
  pods on ``POD_ADDRESSES``).

``skip_reason()`` says why the harness cannot run here (no Go, no openssl, no etcd, no ``unshare -n``, ...): tests
call ``pytest.skip(reason)``.
"""

from __future__ import annotations

import os
import shutil

from harness.k8s.api import ADMIN_TOKEN, READER_TOKEN, KubeApiError
from harness.k8s.build import (
    APISERVER,
    K8S_VERSION,
    TEST_TIMEOUT,
    K8sBuildError,
    K8sUnavailable,
    apiserver_binary,
    is_built,
    timeout_mark,
)
from harness.k8s.cluster import KubeCluster
from harness.k8s.netns import POD_ADDRESSES, NetnsHost, netns_skip_reason
from waypost.etcd.local import EtcdNotFound, find_binary

_skip_cache: dict[bool, str | None] = {}


def skip_reason(netns: bool = True) -> str | None:
    """Why the Kubernetes harness cannot run here, or None. ``netns``: also needs ``unshare -n`` and ``ip``."""
    if netns not in _skip_cache:
        _skip_cache[netns] = _skip_reason(netns)
    return _skip_cache[netns]


def _skip_reason(netns: bool) -> str | None:
    if os.environ.get("WAYPOST_K8S", "1") == "0":
        return "Kubernetes tests turned off by WAYPOST_K8S=0"
    why = APISERVER.skip_reason()
    if why is not None:
        return why
    if shutil.which("openssl") is None:
        return "openssl missing (needed for the test certificates)"
    try:
        find_binary("etcd")
        find_binary("etcdctl")
    except EtcdNotFound as e:
        return str(e)
    return netns_skip_reason() if netns else None


__all__ = [
    "ADMIN_TOKEN", "K8S_VERSION", "POD_ADDRESSES", "READER_TOKEN", "TEST_TIMEOUT", "K8sBuildError", "K8sUnavailable",
    "KubeApiError", "KubeCluster", "NetnsHost", "apiserver_binary", "is_built", "skip_reason", "timeout_mark",
]
