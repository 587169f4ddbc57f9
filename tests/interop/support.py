"""Interop harness: build the Go programs in ``interop/`` once (cached), run them bounded, read their JSON.

The binaries are cached under ``interop/bin/<hash>/`` (gitignored), keyed by a hash of the Go sources,
``go.mod``, ``go.sum`` and ``go version``: an unchanged tree never rebuilds. A cold build of go-zero's
dependency tree takes minutes on 2 cores, hence the generous build timeout. Without a ``go`` toolchain
every interop test is skipped with a message saying so.

Every Go process is started by ``GoProc`` and ended by it (SIGTERM, then SIGKILL after a bound): only
processes this module started are ever signalled.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import waypost
from harness.go_servers import go_binary

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "interop"
BIN_ROOT = INTEROP / "bin"
PROGRAMS = ("gozero-server", "gozero-client", "gozero-sub", "gozero-pub", "gozero-hash", "etcdnaming")
#: a cold build (module download + compiling go-zero, grpc-go, etcd client, k8s client-go) on 2 busy cores
BUILD_TIMEOUT = float(os.environ.get("WAYPOST_INTEROP_BUILD_TIMEOUT", "1500"))
#: per-test bound once the binaries exist (every wait inside a test is bounded far below this)
TEST_TIMEOUT = 180.0


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # never rewrite go.mod/go.sum from a test run; no VCS stamping (the clone may be partial)
    env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
    if not env.get("HOME"):  # go needs somewhere for its caches; keep them beside the binaries
        env.setdefault("GOCACHE", str(BIN_ROOT / ".gocache"))
        env.setdefault("GOPATH", str(BIN_ROOT / ".gopath"))
    return env


def source_hash(go: str) -> str:
    """Hash of everything that determines the binaries."""
    h = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=True).stdout
    h.update(version.encode())
    files = [INTEROP / "go.mod", INTEROP / "go.sum"]
    # interop/xds is a module of its own (tests/xds/go_peers.py builds it): not part of these programs
    own = [p for p in INTEROP.rglob("*.go") if BIN_ROOT not in p.parents and INTEROP / "xds" not in p.parents]
    files += sorted(own)
    for p in files:
        h.update(str(p.relative_to(INTEROP)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(go: str, timeout: float = BUILD_TIMEOUT) -> dict[str, Path]:
    """Build (or reuse) every program; returns name -> binary path. Raises RuntimeError on a failed build."""
    digest = source_hash(go)
    out = BIN_ROOT / digest
    paths = {name: out / name for name in PROGRAMS}
    if all(p.exists() for p in paths.values()):
        return paths
    BIN_ROOT.mkdir(parents=True, exist_ok=True)
    # one builder at a time (two pytest sessions on one tree), the second reuses the first one's output
    with open(BIN_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(p.exists() for p in paths.values()):
            return paths
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=BIN_ROOT))
        try:
            started = time.monotonic()
            proc = subprocess.run(
                [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp) + os.sep, "./cmd/..."],
                cwd=INTEROP, env=_go_env(), capture_output=True, text=True, timeout=timeout, check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"go build failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
            missing = [n for n in PROGRAMS if not (tmp / n).exists()]
            if missing:
                raise RuntimeError(f"go build produced no binary for {missing}")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            # older builds (other source hashes) are dead weight: keep only this one
            for old in BIN_ROOT.iterdir():
                if old.is_dir() and old != out and not old.name.startswith(("build-", ".")):
                    shutil.rmtree(old, ignore_errors=True)
            (out / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def is_built(go: str) -> bool:
    digest = source_hash(go)
    return all((BIN_ROOT / digest / name).exists() for name in PROGRAMS)


def timeout_mark() -> pytest.MarkDecorator:
    """pytest-timeout bound for interop tests: the session's first one may have to build the programs
    (minutes, cold), so while they are not built the bound includes the build timeout."""
    go = go_binary()
    try:
        building = go is not None and not is_built(go)
    except (OSError, subprocess.SubprocessError):
        building = True
    return pytest.mark.timeout(TEST_TIMEOUT + (BUILD_TIMEOUT if building else 0))


_built: dict[str, Path] | None = None
_build_error: str | None = None


def binaries() -> dict[str, Path]:
    """Build once per process; skip when there is no Go toolchain, fail when the build itself fails."""
    global _built, _build_error
    if os.environ.get("WAYPOST_INTEROP", "1") == "0":
        pytest.skip("interop tests turned off by WAYPOST_INTEROP=0")
    go = go_binary()
    if go is None:
        pytest.skip("interop tests need the Go toolchain: `go` is not on PATH (or set WAYPOST_GO)")
    if _build_error is not None:
        pytest.fail(_build_error)
    if _built is None:
        try:
            _built = build(go)
        except (RuntimeError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
            _build_error = f"building interop/ Go programs failed: {e}"
            pytest.fail(_build_error)
    return _built


class GoProc:
    """One running Go program: JSON lines from stdout on a queue, commands to stdin, bounded stop."""

    def __init__(self, binary: Path, *args: str, log_dir: Path) -> None:
        self._launch(binary.name, [str(binary), *args], log_dir, _go_env())

    def _launch(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        """Start ``argv`` (stderr to a file in ``log_dir``) and the thread that reads its stdout."""
        self.name = name
        self.args = argv
        log_dir.mkdir(parents=True, exist_ok=True)
        self._stderr_path = log_dir / f"{name}-{time.monotonic_ns()}.stderr"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env, cwd=cwd)
        self.lines: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _received(self, line: Any) -> Any:
        """A line as it goes on the queue (a subclass may add to it)."""
        return line

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                line = json.loads(text)
            except ValueError:
                line = {"raw": text}
            self.lines.put(self._received(line))
        self.lines.put(None)  # EOF

    def stderr_tail(self, n: int = 3000) -> str:
        self._stderr.flush()
        return self._stderr_path.read_bytes()[-n:].decode(errors="replace")

    def expect(self, pred: Callable[[dict[str, Any]], bool], timeout: float,
               what: str = "") -> dict[str, Any]:
        """The first JSON line (from now on) satisfying ``pred``; fails after ``timeout`` s or on exit."""
        deadline = time.monotonic() + timeout
        seen: list[Any] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no line matching {what or pred} within {timeout} s; "
                                     f"last lines {seen[-5:]}; stderr: {self.stderr_tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.lines.put(None)
                raise AssertionError(f"{self.name} exited (code {self.proc.poll()}) before {what or pred}; "
                                     f"last lines {seen[-5:]}; stderr: {self.stderr_tail()}")
            seen.append(line)
            if pred(line):
                return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, line: str, key: str, timeout: float) -> Any:
        """Send a command and return the ``key`` field of the next line that has it."""
        self.send(line)
        return self.expect(lambda d: key in d or "error" in d, timeout, f"answer to {line!r}").get(key)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (and close stdin), wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no deregistration (a crash)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class GoPeers:
    """Starts Go programs for one test and stops every one of them at the end."""

    def __init__(self, bins: dict[str, Path], log_dir: Path) -> None:
        self.bins = bins
        self.log_dir = log_dir
        self.started: list[GoProc] = []

    def start(self, program: str, *args: str) -> GoProc:
        p = GoProc(self.bins[program], *args, log_dir=self.log_dir)
        self.started.append(p)
        return p

    def run(self, program: str, *args: str, stdin: str = "", timeout: float = 60.0) -> Any:
        """Run to completion; returns the last JSON line on stdout."""
        proc = subprocess.run([str(self.bins[program]), *args], input=stdin.encode(), capture_output=True,
                              timeout=timeout, env=_go_env(), check=False)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace")[-3000:]
            raise AssertionError(f"{program} exited {proc.returncode}: {err}")
        lines = [ln for ln in proc.stdout.decode().split("\n") if ln.strip()]  # not splitlines(): U+0085 etc.
        return json.loads(lines[-1])

    def close(self) -> None:
        for p in reversed(self.started):
            p.stop(timeout=8.0)


@pytest.fixture(scope="session", name="go_bins")
def fixture_go_bins() -> dict[str, Path]:
    """The interop binaries (built once per session; skipped without Go)."""
    return binaries()


@pytest.fixture(name="go_peers")
def fixture_go_peers(go_bins: dict[str, Path], tmp_path: Path) -> Iterator[GoPeers]:
    """Starts Go programs for one test; all of them are stopped afterwards."""
    peers = GoPeers(go_bins, tmp_path / "go-logs")
    try:
        yield peers
    finally:
        peers.close()


# -- the Python side: backends that name themselves, and a client that reads the name ----------------

#: the header/trailer both Go and Python backends use to say who answered (interop/internal/peer)
BACKEND_HEADER = "x-backend"


class NameTrailer(grpc.ServerInterceptor):
    """Sets ``x-backend: <name>`` as trailing metadata on every unary call (the Go peers do the same)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        name = self.name

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            context.set_trailing_metadata(((BACKEND_HEADER, name),))
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


@contextlib.contextmanager
def py_backends(names: list[str], key: str, registry_url: str, **serve_kw: Any) -> Iterator[dict[str, Any]]:
    """``waypost.serve`` one gRPC server per name on 127.0.0.1 (health service added by serve);
    yields name -> ServeHandle; every server still running is stopped at the end."""
    handles: dict[str, Any] = {}
    try:
        for name in names:
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[NameTrailer(name)])
            handles[name] = waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry_url,
                                          grace=1.0, **serve_kw)
        yield handles
    finally:
        for h in handles.values():
            h.stop(0)


def call_counts(channel: grpc.Channel, n: int, timeout: float = 5.0) -> collections.Counter[str]:
    """``n`` health checks over ``channel``; counts the backend named in each answer's trailer
    (failures are counted as ``error:<CODE>``)."""
    stub = health_pb2_grpc.HealthStub(channel)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        try:
            _, call = stub.Check.with_call(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as e:
            counts[f"error:{e.code().name}"] += 1
            continue
        names = [v for k, v in (call.trailing_metadata() or ()) if k == BACKEND_HEADER]
        counts[names[0] if names else "unnamed"] += 1
    return counts
