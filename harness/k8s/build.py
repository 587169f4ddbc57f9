"""kube-apiserver for the tests, built from source once and cached.

``apiserver_binary()`` builds kube-apiserver v1.36.3 with ``BUILD_SCRIPT`` into
``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/kube-apiserver-v1.36.3-<go version hash>/`` (the build log
beside the binary), under a file lock so that concurrent test processes build it once (harness/go_servers.py). A
cold build takes minutes on 2 cores (about 7); a warm one reuses Go's build cache and only links again.
``$WAYPOST_KUBE_APISERVER`` names an already built binary instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.go_servers import BuildError, GoServer, Unavailable

K8S_VERSION = "v1.36.3"
#: per-test bound once the binary exists
TEST_TIMEOUT = 240.0

# The recipe, byte for byte the commands of every earlier build's build.sh: Go's build cache keys on them, so a
# second build in another directory only links again.
BUILD_SCRIPT = """set -e
go mod download -json k8s.io/kubernetes@v1.36.3 > dl.json
GM=$(python3 -c 'import json; print(json.load(open("dl.json"))["GoMod"])')
{ printf 'module scratch/k8sbuild\\n\\ngo 1.26.0\\n\\nrequire k8s.io/kubernetes v1.36.3\\n\\nreplace (\\n'
  sed -n '/^replace/,/^)/p' "$GM" | grep '=>' | awk '{print "\\t"$1" => "$1" v0.36.3"}'; printf ')\\n'; } > go.mod
GOFLAGS=-mod=mod go get k8s.io/kubernetes/cmd/kube-apiserver@v1.36.3
GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
"""


K8sUnavailable = Unavailable  # the harness cannot run on this machine (the message says why): tests skip with it
K8sBuildError = BuildError  # building kube-apiserver failed (a real failure, not a skip)


APISERVER = GoServer("kube-apiserver", K8S_VERSION, BUILD_SCRIPT, env_binary="WAYPOST_KUBE_APISERVER",
                     timeout_env="WAYPOST_K8S_BUILD_TIMEOUT", default_timeout=1800.0, min_go=(1, 26))


def is_built() -> bool:
    return APISERVER.is_built()


def timeout_mark() -> Any:
    """pytest-timeout bound for a test whose setup may have to build kube-apiserver (cold: minutes)."""
    import pytest

    return pytest.mark.timeout(TEST_TIMEOUT + (0 if is_built() else APISERVER.build_timeout()))


def apiserver_binary(timeout: float | None = None) -> Path:
    """The kube-apiserver binary, built once per Go toolchain (harness/go_servers.py). Raises ``K8sUnavailable``
    when it cannot be built here and ``K8sBuildError`` when the build fails or exceeds its timeout
    (``$WAYPOST_K8S_BUILD_TIMEOUT``, 1800 s)."""
    return APISERVER.binary(timeout)


__all__ = ["APISERVER", "K8S_VERSION", "TEST_TIMEOUT", "K8sBuildError", "K8sUnavailable", "apiserver_binary",
           "is_built", "timeout_mark"]
