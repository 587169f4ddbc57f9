"""Real foreign gRPC peers for waypost's xDS control plane and ORCA reports: the Go programs, built once.

Programs (sources in ``interop/xds/`` — a Go module of its own on grpc-go v1.85.0 — and ``interop/xds-java/``,
a Maven project on grpc-java 1.85.1); every one prints JSON lines on stdout and is bounded by its flags:

* ``xds-client`` (Go) / ``XdsClient`` (Java): dial ``xds:///NAME`` with the bootstrap in
  ``GRPC_XDS_BOOTSTRAP_CONFIG``, call ``/waypost.test.Echo/Unary`` N times; a progress line every ``batch`` calls
  (``{"batch": k, "done": n, "t": s, "counts": {server: n}, "errors": e}``, counts of that batch only), then
  ``{"counts": {server: n}, "errors": n, "first_error": "...", "calls": n, "seconds": s, "codes": {...}}``.
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

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from harness.go_servers import build_env, go_binary, go_version, servers_cache
from tests.xds.peer_procs import ROOT, TEST_TIMEOUT, BuildError, run_build

GO_DIR = ROOT / "interop" / "xds"
GO_PROGRAMS = ("xds-client", "wrr-client", "orca-server")
GO_BUILD_TIMEOUT = float(os.environ.get("WAYPOST_XDS_GO_BUILD_TIMEOUT", "900"))


# -- Go: build once, cached ---------------------------------------------------------------------------------

def go_source_hash(go: str) -> str:
    h = hashlib.sha256(go_version(go).encode())
    files = [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.rglob("*.go"))]
    for p in files:
        h.update(str(p.relative_to(GO_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def go_out_dir(go: str) -> Path:
    return servers_cache() / f"interop-xds-go-{go_source_hash(go)}"


def build_go(go: str, timeout: float = GO_BUILD_TIMEOUT) -> dict[str, Path]:
    """Build (or reuse) the Go programs; name -> binary. BuildError on failure."""
    out = go_out_dir(go)
    paths = {n: out / n for n in GO_PROGRAMS}
    if all(p.is_file() for p in paths.values()):
        return paths
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the binaries
        if all(p.is_file() for p in paths.values()):
            return paths
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}-build-", dir=out.parent))
        log_path = out.parent / f"{out.name}.build.log"
        env = build_env(go)
        env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
        started = time.monotonic()
        try:
            with open(log_path, "wb") as logf:
                try:
                    run_build([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp) + os.sep, "./cmd/..."],
                               GO_DIR, env, logf, timeout, "go build of interop/xds")
                except BuildError as e:
                    tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                    raise BuildError(f"{e}; log {log_path}:\n{tail}") from None
            missing = [n for n in GO_PROGRAMS if not (tmp / n).is_file()]
            if missing:
                raise BuildError(f"go build produced no binary for {missing}")
            (tmp / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in out.parent.glob("interop-xds-go-*"):  # other source hashes are dead weight
                if old.is_dir() and old != out and "-build-" not in old.name:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def go_skip_reason() -> str | None:
    if os.environ.get("WAYPOST_INTEROP", "1") == "0":
        return "interop tests turned off by WAYPOST_INTEROP=0"
    go = go_binary()
    if go is None:
        return "the xDS/ORCA interop peers need the Go toolchain: `go` is not on PATH (or set WAYPOST_GO)"
    want = re.search(r"^go (\d+)\.(\d+)", (GO_DIR / "go.mod").read_text(), re.MULTILINE)
    try:
        have = re.search(r"go(\d+)\.(\d+)", go_version(go))
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{go} version` failed: {e}"
    if want and have and (int(have[1]), int(have[2])) < (int(want[1]), int(want[2])):
        return (f"interop/xds (grpc-go v1.85.0) needs Go {want[1]}.{want[2]}+, {go} is go{have[1]}.{have[2]} "
                "(set WAYPOST_GO)")
    return None


def go_is_built() -> bool:
    go = go_binary()
    try:
        return go is not None and all((go_out_dir(go) / n).is_file() for n in GO_PROGRAMS)
    except (OSError, subprocess.SubprocessError):
        return False


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
        go = go_binary()
        assert go is not None
        try:
            _go_built = build_go(go)
        except (BuildError, OSError, subprocess.SubprocessError) as e:
            _go_error = f"building interop/xds failed: {e}"
            pytest.fail(_go_error)
    return _go_built


def go_timeout_mark() -> pytest.MarkDecorator:
    """pytest-timeout bound: the first test of a cold session may build the Go programs."""
    return pytest.mark.timeout(TEST_TIMEOUT + (0 if go_is_built() or go_skip_reason() else GO_BUILD_TIMEOUT))
