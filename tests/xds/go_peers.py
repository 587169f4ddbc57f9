"""Real foreign gRPC peers for waypost's xDS control plane and ORCA reports: the Go programs, built once.

Programs (sources in ``interop/xds/`` — a Go module of its own on grpc-go v1.85.0 — and ``interop/xds-java/``,
a Maven project on grpc-java 1.85.1); every one prints JSON lines on stdout and is bounded by its flags:

* ``xds-client`` (Go) / ``XdsClient`` (Java): dial ``xds:///NAME`` with the bootstrap in
  ``GRPC_XDS_BOOTSTRAP_CONFIG``, call ``/waypost.test.Echo/Unary`` N times; a progress line every ``batch`` calls
  (``{"batch": k, "done": n, "t": s, "counts": {server: n}, "errors": e}``, counts of that batch only), then
  ``{"counts": {server: n}, "errors": n, "first_error": "...", "calls": n, "seconds": s, "codes": {...}}``.
* ``xds-targets`` (Go): the same over several ``-target`` in one process (grpc-go opens one xDS client, one ADS
  stream, per target), a ``{"target": T}`` line before each target's lines, then ``{"holding": true}`` with
  every channel kept open until SIGTERM.
* ``wrr-client`` (Go): the same over a fixed address list with a service config (weighted_round_robin, A58).
* ``orca-server`` (Go): an Echo server (reply ``server`` = its name) reporting ORCA through grpc-go's own
  ``orca`` package: per call (``endpoint-load-metrics-bin`` trailer) and, with ``oob``, OpenRcaService. grpc-go
  answers OOB streams at once and then every max(requested interval, 30 s) (its floor).

Builds: Go into ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/interop-xds-go-<hash>/`` and Java (classes plus
``classpath.txt``, jars in ~/.m2) into ``.../xds-java-<hash>/``, keyed by a hash of the sources (and the
toolchain's version), built under a file lock, niced, bounded (``WAYPOST_XDS_GO_BUILD_TIMEOUT``,
``WAYPOST_XDS_JAVA_BUILD_TIMEOUT``). Tests skip with the reason when go (or a Go as new as go.mod asks) / java /
javac / mvn are missing, or with ``WAYPOST_INTEROP=0``; a failed build fails them. Measured on 2 busy cores: Go cold
2-4 min (grpc-go's xDS tree: 1m47 s of CPU with an empty build cache, 4 min wall niced beside a load of 10; 3-10 s
with Go's build cache warm), Java cold ~40 s (Maven 29-39 s
into an empty ~/.m2 part, javac ~8 s); warm, both are a hash and a file check.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.go_module import GoModule
from tests.xds.peer_procs import ROOT, TEST_TIMEOUT, BuildError

GO_DIR = ROOT / "interop" / "xds"
GO_PROGRAMS = ("xds-client", "xds-targets", "wrr-client", "orca-server")
GO_BUILD_TIMEOUT = float(os.environ.get("WAYPOST_XDS_GO_BUILD_TIMEOUT", "900"))


# -- Go: build once, cached ---------------------------------------------------------------------------------

GO_MODULE = GoModule(GO_DIR, GO_PROGRAMS, "interop-xds-go")


def go_skip_reason() -> str | None:
    if os.environ.get("WAYPOST_INTEROP", "1") == "0":
        return "interop tests turned off by WAYPOST_INTEROP=0"
    return GO_MODULE.skip_reason()


def go_is_built() -> bool:
    return GO_MODULE.is_built()


_go_built: dict[str, Path] | None = None
_go_error: str | None = None


def go_programs() -> dict[str, Path]:
    """The Go programs, built once per process: skips without Go, fails when the build fails."""
    global _go_built, _go_error
    reason = go_skip_reason()
    if reason:
        pytest.skip(reason)
    if _go_error is not None:
        pytest.fail(_go_error)
    if _go_built is None:
        try:
            _go_built = GO_MODULE.build(GO_BUILD_TIMEOUT)
        except (BuildError, OSError, subprocess.SubprocessError) as e:
            _go_error = f"building interop/xds failed: {e}"
            pytest.fail(_go_error)
    return _go_built


def go_timeout_mark() -> pytest.MarkDecorator:
    """pytest-timeout bound: the first test of a cold session may build the Go programs."""
    return pytest.mark.timeout(TEST_TIMEOUT + (0 if go_is_built() or go_skip_reason() else GO_BUILD_TIMEOUT))
