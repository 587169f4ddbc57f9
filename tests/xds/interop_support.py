"""Real foreign gRPC peers for waypost's xDS control plane and ORCA reports: Go and Java programs, built once.

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

Stable API (other tests import these; keep names and signatures):

``start_orca_server(name, *, cpu=None, app=None, mem=None, rps=None, eps=None, oob=False, percall=True,
call_cpu=None, named=None, util=None, listen="127.0.0.1:0", timeout=30.0, oob_floor=None) -> OrcaServer``
    A running grpc-go orca-server; ``.address`` ("127.0.0.1:PORT"), ``.name``, ``.set(cpu=..., rps=...,
    named={...}, util={...}) -> dict`` changes what it reports (per call at once; OOB on the next report),
    ``.served() -> int``, ``.stop()``; a context manager. ``None`` = that metric is not reported; ``call_cpu``
    makes the per-call cpu_utilization differ from the OOB one (to see which one a client follows);
    ``oob_floor`` (s) serves OOB through the module's own OpenRcaService with that floor instead of grpc-go's 30 s.
``start_wrr_client(addresses, config, calls, *, batch=0, interval=0.0, deadline=5.0, max_time=300.0) -> ClientRun``
    The same client running: ``.progress()`` returns each batch line, ``.finish(interrupt=True)`` the final one.
``run_wrr_client(addresses, config, calls, *, batch=0, interval=0.0, deadline=5.0, timeout=120.0) -> dict``
    grpc-go over ``addresses`` (list of "HOST:PORT") with the service config ``config`` (dict or JSON text);
    returns the final line plus ``"batches"``: the progress lines in order.
``wrr_config(*, oob=False, blackout="1s", weight_update="0.1s", oob_period="0.2s", **more) -> dict``
    A weighted_round_robin service config (give a non-zero blackout: see the trap at the end).

xDS helpers: ``xds_control_plane(exports, registry=None) -> (addr, bootstrap_json, proc)`` runs
``python -m waypost.cli xds serve`` (stop it with ``proc.stop()``); ``run_xds_client(lang, target, bootstrap,
calls, ...)`` ("go" or "java") runs one client to the end; ``start_xds_client(...)`` returns a running one
(``.progress()``, ``.finish()``) so a test can watch traffic move during a run; ``watch(run, pred, timeout, what)``
waits for a batch whose counts satisfy ``pred``. Backends: ``serve_echo`` (in process) and ``start_echo_process``
(a process of its own, for SIGTERM) register Echo servers with ``waypost.serve``. ``XdsSetup`` and the
``scenario_*`` functions are the cross-language xDS tests, run by test_xds_go.py and test_xds_java.py alike.

Builds: Go into ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/interop-xds-go-<hash>/`` and Java (classes plus
``classpath.txt``, jars in ~/.m2) into ``.../xds-java-<hash>/``, keyed by a hash of the sources (and the
toolchain's version), built under a file lock, niced, bounded (``WAYPOST_XDS_GO_BUILD_TIMEOUT``,
``WAYPOST_XDS_JAVA_BUILD_TIMEOUT``). Tests skip with the reason when go (or a Go as new as go.mod asks) / java /
javac / mvn are missing, or with ``WAYPOST_INTEROP=0``; a failed build fails them. Measured on 2 busy cores: Go cold
2-4 min (grpc-go's xDS tree: 1m47 s of CPU with an empty build cache, 4 min wall niced beside a load of 10; 3-10 s
with Go's build cache warm), Java cold ~40 s (Maven 29-39 s
into an empty ~/.m2 part, javac ~8 s); warm, both are a hash and a file check.

Every process is started here and stopped here by its PID (SIGTERM, SIGKILL after a bound): ``stop_started()``
(the ``xds_procs`` fixture calls it after each test) and ``harness/proc_reaper.py`` (at exit, and on SIGTERM/SIGHUP).

Trap (grpc-go): a client_side_weighted_round_robin blackout_period of 0 received over xDS is dropped by grpc-go's
converter, so gRPC's 10 s default applies (the control plane sends 1 ns instead, docs/xds.md); in a service config
here, too, give a non-zero blackout so that weights apply within a test's time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pytest

from harness import proc_reaper
from harness.go_servers import build_env, go_binary, go_version, servers_cache
from tests.interop.support import GoProc

ROOT = Path(__file__).resolve().parents[2]
GO_DIR = ROOT / "interop" / "xds"
JAVA_DIR = ROOT / "interop" / "xds-java"
GO_PROGRAMS = ("xds-client", "wrr-client", "orca-server")
JAVA_MAIN = "waypost.interop.XdsClient"
GO_BUILD_TIMEOUT = float(os.environ.get("WAYPOST_XDS_GO_BUILD_TIMEOUT", "900"))
JAVA_BUILD_TIMEOUT = float(os.environ.get("WAYPOST_XDS_JAVA_BUILD_TIMEOUT", "600"))
#: per-test bound once everything is built
TEST_TIMEOUT = 120.0
LOG_DIR = Path(tempfile.gettempdir()) / f"waypost-xds-interop-{os.getpid()}"


class BuildError(RuntimeError):
    """A build failed (a real failure, not a skip)."""


# -- processes ------------------------------------------------------------------------------------------

_live: list[PeerProc] = []


class PeerProc(GoProc):
    """A foreign peer (Go binary, JVM, or a waypost CLI) with GoProc's JSON-line reader and bounded stop;
    takes a full argv and extra environment. Lines that are not JSON arrive as ``{"raw": text}``."""

    def __init__(self, argv: Sequence[str], name: str, *, env: Mapping[str, str] | None = None,
                 log_dir: Path | None = None, cwd: Path | None = None) -> None:
        self._launch(name, [str(a) for a in argv], log_dir or LOG_DIR, {**os.environ, **(env or {})}, cwd)
        _live.append(self)
        proc_reaper.track(self, lambda: self.stop(timeout=8.0))  # stopped at exit or on SIGTERM if still up

    def _received(self, line: Any) -> Any:
        """Each JSON object stamped ``"_at"``: time.monotonic() when it arrived."""
        if isinstance(line, dict):
            line["_at"] = time.monotonic()
        return line

    def stop(self, timeout: float = 10.0) -> int:
        rc = super().stop(timeout)
        with contextlib.suppress(ValueError):
            _live.remove(self)
        proc_reaper.untrack(self)
        return rc

    def terminate(self) -> None:
        """SIGTERM without waiting (the program's own graceful path)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_started(keep: Sequence[PeerProc] = ()) -> None:
    """Stop every peer started here and still running, except those in ``keep``."""
    for p in reversed(list(_live)):
        if not any(p is k for k in keep):
            with contextlib.suppress(Exception):
                p.stop(timeout=8.0)



@pytest.fixture(name="xds_procs")
def fixture_xds_procs() -> Iterator[None]:
    """Stops every peer a test started, whatever happened to the test (those of wider fixtures stay)."""
    before = list(_live)
    try:
        yield
    finally:
        stop_started(before)


# -- Go: build once, cached ---------------------------------------------------------------------------------

def go_source_hash(go: str) -> str:
    h = hashlib.sha256(go_version(go).encode())
    files = [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.rglob("*.go"))]
    for p in files:
        h.update(str(p.relative_to(GO_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def go_out_dir(go: str) -> Path:
    return servers_cache() / f"interop-xds-go-{go_source_hash(go)}"


def _run_build(argv: Sequence[str], cwd: Path, env: Mapping[str, str], logf: Any, limit: float, what: str) -> None:
    """One niced build step in its own process group, killed whole past ``limit`` seconds."""
    logf.write(f"$ {' '.join(argv)}\n".encode())
    logf.flush()
    proc = subprocess.Popen(["nice", "-n", "10", *argv], cwd=cwd, env=dict(env), stdout=logf,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        rc = proc_reaper.wait_group(proc, max(limit, 1.0))
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what} took longer than its bound ({limit:.0f} s left)") from None
    if rc != 0:
        raise BuildError(f"{what} failed (exit {rc})")


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
                    _run_build([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp) + os.sep, "./cmd/..."],
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


def _duration(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 0)}ms"


# -- ORCA peers (stable API) ---------------------------------------------------------------------------------

class OrcaServer(PeerProc):
    """A running ``orca-server`` (see the module docstring)."""

    address: str

    def set(self, **values: Any) -> dict[str, Any]:
        """Change the reported load: cpu, app, mem, rps, eps (floats; negative stops reporting one),
        named={k: v}, util={k: v}. Returns what it reports now."""
        words = []
        for k, v in values.items():
            if k in ("named", "util"):
                words += [f"{k}.{nk}={float(nv)}" for nk, nv in dict(v).items()]
            else:
                words.append(f"{k}={float(v)}")
        self.send("set " + " ".join(words))
        line = self.expect(lambda d: "set" in d or "error" in d, 10.0, "answer to set")
        if "error" in line:
            raise ValueError(f"orca-server {self.name}: {line['error']}")
        return line["set"]

    def served(self) -> int:
        """Echo calls answered so far."""
        return int(self.request("stats", "served", 10.0))


def start_orca_server(name: str, *, cpu: float | None = None, app: float | None = None, mem: float | None = None,
                      rps: float | None = None, eps: float | None = None, oob: bool = False, percall: bool = True,
                      call_cpu: float | None = None, named: Mapping[str, float] | None = None,
                      util: Mapping[str, float] | None = None, listen: str = "127.0.0.1:0",
                      timeout: float = 30.0, oob_floor: float | None = None) -> OrcaServer:
    """Start a grpc-go Echo server reporting ORCA (module docstring); returns once it listens.
    ``oob_floor`` (seconds, with ``oob``): serve OpenRcaService from the same recorder with this minimum interval
    instead of grpc-go's orca.Register (floor 30 s), so that ``set`` reaches OOB clients quickly."""
    binary = go_programs()["orca-server"]
    args = [str(binary), "-listen", listen, "-name", name, f"-oob={'true' if oob else 'false'}",
            f"-percall={'true' if percall else 'false'}"]
    for flag, value in (("-cpu", cpu), ("-app", app), ("-mem", mem), ("-rps", rps), ("-eps", eps),
                        ("-call-cpu", call_cpu)):
        if value is not None:
            args += [flag, repr(float(value))]
    if oob_floor is not None:
        args += ["-oob-floor", _duration(oob_floor)]
    for k, v in (named or {}).items():
        args += ["-named", f"{k}={float(v)}"]
    for k, v in (util or {}).items():
        args += ["-util", f"{k}={float(v)}"]
    server = OrcaServer(args, f"orca-server-{name}")
    try:
        line = server.expect(lambda d: "listening" in d or "fatal" in d, timeout, "listening")
        if "fatal" in line:
            raise RuntimeError(f"orca-server {name}: {line['fatal']}")
    except BaseException:
        server.stop()
        raise
    server.address = line["listening"]
    return server


#: gRFC A58, weight = qps / utilization: cpu 0.9/0.3/0.1 at 100 rps each -> 111/333/1000 -> of 600 calls
A58_LOADS = {"hot": 0.9, "warm": 0.3, "cool": 0.1}
A58_EXPECTED_600 = {name: 600 * (1 / cpu) / sum(1 / c for c in A58_LOADS.values()) for name, cpu in A58_LOADS.items()}


def check_a58_split(counts: Mapping[str, int], label: str, prefix: str = "") -> None:
    """600 calls split as A58 predicts for A58_LOADS (names with ``prefix``), within a generous tolerance
    (25 %, at least 20 calls); prints the figures."""
    want = {prefix + k: v for k, v in A58_EXPECTED_600.items()}
    print(f"\n{label}: {dict(sorted(counts.items()))} (A58 expects "
          + ", ".join(f"{k} {v:.0f}" for k, v in want.items()) + ")")
    assert sum(counts.values()) == 600, counts
    for name, expected in want.items():
        assert abs(counts.get(name, 0) - expected) <= max(0.25 * expected, 20), (label, counts)


def wrr_config(*, oob: bool = False, blackout: str = "1s", weight_update: str = "0.1s", oob_period: str = "0.2s",
               **more: Any) -> dict[str, Any]:
    """A grpc-go service config running weighted_round_robin (gRFC A58) with these settings."""
    cfg: dict[str, Any] = {"enableOobLoadReport": oob, "blackoutPeriod": blackout,
                           "weightUpdatePeriod": weight_update}
    if oob:
        cfg["oobReportingPeriod"] = oob_period
    cfg.update(more)
    return {"loadBalancingConfig": [{"weighted_round_robin": cfg}]}


def _client_args(calls: int, batch: int, interval: float, deadline: float,
                 headers: Mapping[str, str] | None, keys: int, wait_for_ready: bool, max_time: float) -> list[str]:
    args = ["-calls", str(calls), "-batch", str(batch), "-interval", _duration(interval),
            "-deadline", _duration(deadline), "-max-time", _duration(max_time)]
    for k, v in (headers or {}).items():
        args += ["-header", f"{k}={v}"]
    if keys:
        args += ["-keys", str(keys)]
    if wait_for_ready:
        args.append("-wait-for-ready")
    return args


class ClientRun(PeerProc):
    """A running client: ``progress()`` returns its next batch line, ``finish()`` its final line (plus
    ``"batches"``: every progress line it printed)."""

    batches: list[dict[str, Any]]

    def progress(self, timeout: float = 30.0) -> dict[str, Any]:
        line = self.expect(lambda d: "batch" in d or "calls" in d or "fatal" in d, timeout, "a progress line")
        if "batch" not in line:
            self.lines.put(line)  # the final line: leave it for finish()
            raise AssertionError(f"{self.name} ended before another batch: {line}")
        self.batches.append(line)
        return line

    def finish(self, timeout: float = 120.0, interrupt: bool = False) -> dict[str, Any]:
        """Wait for the final line (SIGTERM first with ``interrupt``: the client stops calling and reports)."""
        if interrupt:
            self.terminate()
        while True:
            line = self.expect(lambda d: "batch" in d or "calls" in d or "fatal" in d, timeout, "the final line")
            if "fatal" in line:
                raise AssertionError(f"{self.name}: {line['fatal']}; stderr: {self.stderr_tail()}")
            if "batch" in line:
                self.batches.append(line)
                continue
            self.stop()
            return {**line, "batches": list(self.batches)}


def start_wrr_client(addresses: Sequence[str], config: Mapping[str, Any] | str, calls: int, *, batch: int = 0,
                     interval: float = 0.0, deadline: float = 5.0, max_time: float = 300.0) -> ClientRun:
    """grpc-go ``wrr-client`` running (see run_wrr_client)."""
    binary = go_programs()["wrr-client"]
    cfg = config if isinstance(config, str) else json.dumps(config)
    args = [str(binary), "-target", "ipv4:" + ",".join(addresses), "-config", cfg,
            *_client_args(calls, batch, interval, deadline, None, 0, False, max_time)]
    run = ClientRun(args, "wrr-client")
    run.batches = []
    return run


def run_wrr_client(addresses: Sequence[str], config: Mapping[str, Any] | str, calls: int, *, batch: int = 0,
                   interval: float = 0.0, deadline: float = 5.0, timeout: float = 120.0) -> dict[str, Any]:
    """grpc-go over ``addresses`` with the service config ``config``: ``calls`` Echo calls, then the final line
    (``counts``, ``errors``, ``first_error``, ``calls``, ``seconds``) with ``batches`` (progress lines)."""
    run = start_wrr_client(addresses, config, calls, batch=batch, interval=interval, deadline=deadline,
                           max_time=timeout)
    try:
        return run.finish(timeout + 10.0)
    finally:
        run.stop()


# -- Java: Maven once, cached ------------------------------------------------------------------------------

def java_binary() -> str | None:
    return os.environ.get("WAYPOST_JAVA") or shutil.which("java")


def _java_version(java: str) -> str:
    return subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=True).stderr


def java_source_hash(java: str) -> str:
    h = hashlib.sha256(_java_version(java).encode())
    for p in [JAVA_DIR / "pom.xml", *sorted(JAVA_DIR.rglob("*.java"))]:
        h.update(str(p.relative_to(JAVA_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def java_out_dir(java: str) -> Path:
    return servers_cache() / f"xds-java-{java_source_hash(java)}"


def java_skip_reason() -> str | None:
    if os.environ.get("WAYPOST_INTEROP", "1") == "0":
        return "interop tests turned off by WAYPOST_INTEROP=0"
    java = java_binary()
    if java is None:
        return "the grpc-java xDS client needs java (17+) on PATH (or set WAYPOST_JAVA)"
    if shutil.which("javac") is None and not java_is_built():
        return "no javac on PATH to compile interop/xds-java (a JDK 17+ is needed, not only a JRE)"
    if shutil.which("mvn") is None and not java_is_built():
        return "no mvn on PATH to fetch grpc-java's jars for interop/xds-java"
    return None


def java_is_built() -> bool:
    java = java_binary()
    try:
        return java is not None and (java_out_dir(java) / "complete").is_file()
    except (OSError, subprocess.SubprocessError):
        return False


def build_java(timeout: float = JAVA_BUILD_TIMEOUT) -> Path:
    """Resolve the classpath with Maven and javac the sources (or reuse them); returns the output directory
    (``classes/`` and ``classpath.txt``). BuildError on failure."""
    java = java_binary()
    assert java is not None
    out = java_out_dir(java)
    if (out / "complete").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "complete").is_file():
            return out
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        work = out / "project"
        shutil.copytree(JAVA_DIR, work, ignore=shutil.ignore_patterns("target"))
        log_path = out / "build.log"
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        env = dict(os.environ)
        try:
            with open(log_path, "wb") as logf:
                _run_build(["mvn", "-q", "-B", "dependency:build-classpath",
                            f"-Dmdep.outputFile={out / 'classpath.txt'}"],
                           work, env, logf, deadline - time.monotonic(), "mvn dependency:build-classpath")
                mvn_seconds = time.monotonic() - started
                sources = sorted(str(p) for p in (work / "src").rglob("*.java"))
                classpath = (out / "classpath.txt").read_text().strip()
                javac = shutil.which("javac") or str(Path(java).parent / "javac")
                _run_build([javac, "--release", "17", "-d", str(out / "classes"), "-cp", classpath, *sources],
                           work, env, logf, deadline - time.monotonic(), "javac")
        except (BuildError, OSError) as e:
            tail = log_path.read_bytes()[-3000:].decode(errors="replace") if log_path.exists() else ""
            raise BuildError(f"building interop/xds-java: {e}; log {log_path}:\n{tail}") from None
        (out / "build-seconds").write_text(f"mvn {mvn_seconds:.1f} total {time.monotonic() - started:.1f}\n")
        (out / "complete").write_text("ok\n")
        for old in out.parent.glob("xds-java-*"):
            if old.is_dir() and old != out:
                shutil.rmtree(old, ignore_errors=True)
    return out


_java_built: Path | None = None
_java_error: str | None = None


def java_classpath() -> str:
    """classes + jars of the Java client, built once per process (skip / fail like go_programs)."""
    global _java_built, _java_error
    reason = java_skip_reason()
    if reason:
        pytest.skip(reason)
    if _java_error is not None:
        pytest.fail(_java_error)
    if _java_built is None:
        try:
            _java_built = build_java()
        except (BuildError, OSError, subprocess.SubprocessError) as e:
            _java_error = str(e)
            pytest.fail(_java_error)
    return f"{_java_built / 'classes'}{os.pathsep}{(_java_built / 'classpath.txt').read_text().strip()}"


def java_timeout_mark() -> pytest.MarkDecorator:
    return pytest.mark.timeout(TEST_TIMEOUT + (0 if java_is_built() or java_skip_reason() else JAVA_BUILD_TIMEOUT))


# -- xDS: control plane and clients --------------------------------------------------------------------------

def xds_control_plane(exports: Mapping[str, str], registry: str | None = None, *,
                      extra_args: Sequence[str] = (), timeout: float = 60.0) -> tuple[str, str, PeerProc]:
    """``python -m waypost.cli xds serve --listen 127.0.0.1:0 --export NAME=TARGET ...`` as a subprocess;
    returns (its address, the client bootstrap JSON from ``waypost xds bootstrap``, the process). An export's
    value may carry options after the target (``"KEY policy=ring_hash hash_header=x-key"``)."""
    pytest.importorskip("envoy.service.discovery.v3.ads_pb2",
                        reason="waypost's xDS control plane needs the xds extra (xds-protos)")
    argv = [sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0"]
    if registry:
        argv += ["--registry", registry]
    for name, target in exports.items():
        argv += ["--export", f"{name}={target}"]
    argv += list(extra_args)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = PeerProc(argv, "waypost-xds-serve", env=env, cwd=ROOT)
    try:
        line = proc.expect(lambda d: str(d.get("raw", "")).startswith("xds: serving on"), timeout,
                           "'xds: serving on HOST:PORT'")
        addr = line["raw"].split("xds: serving on", 1)[1].strip()
        boot = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server", addr,
                               "--node-id", f"waypost-interop-{os.getpid()}"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env}, cwd=ROOT, check=False)
        if boot.returncode != 0:
            raise AssertionError(f"waypost xds bootstrap failed ({boot.returncode}): {boot.stderr[-2000:]}")
        json.loads(boot.stdout)  # it is the JSON itself
    except BaseException:
        proc.stop()
        raise
    return addr, boot.stdout, proc


def start_xds_client(lang: str, target: str, bootstrap: str, calls: int, *, interval: float = 0.0,
                     batch: int = 0, headers: Mapping[str, str] | None = None, keys: int = 0,
                     deadline: float = 5.0, wait_for_ready: bool = False, max_time: float = 300.0) -> ClientRun:
    """A grpc-go (``lang="go"``) or grpc-java (``"java"``) client of ``target`` (xds:///NAME) running."""
    args = _client_args(calls, batch, interval, deadline, headers, keys, wait_for_ready, max_time)
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap}
    if lang == "go":
        run = ClientRun([str(go_programs()["xds-client"]), "-target", target, *args], "xds-client-go", env=env)
    elif lang == "java":
        java = java_binary()
        assert java is not None
        cp = java_classpath()
        run = ClientRun([java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", cp,
                         JAVA_MAIN, "-target", target, *args], "xds-client-java", env=env)
    else:
        raise ValueError(f"lang must be 'go' or 'java', not {lang!r}")
    run.batches = []
    return run


def run_xds_client(lang: str, target: str, bootstrap: str, calls: int, *, interval: float = 0.0, batch: int = 0,
                   headers: Mapping[str, str] | None = None, keys: int = 0, deadline: float = 5.0,
                   wait_for_ready: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Run one xDS client to its end; returns its final line with ``batches``."""
    run = start_xds_client(lang, target, bootstrap, calls, interval=interval, batch=batch, headers=headers,
                           keys=keys, deadline=deadline, wait_for_ready=wait_for_ready, max_time=timeout)
    try:
        return run.finish(timeout + 30.0)
    finally:
        run.stop()


# -- backends: waypost.serve'd Echo servers (in process, or a process of their own) ----------------------------

def serve_echo(name: str, key: str, registry: str, *, metadata: Mapping[str, Any] | None = None,
               grace: float = 3.0) -> Any:
    """An Echo server (replies name ``name``) started and registered under ``key`` with ``waypost.serve``;
    returns its ServeHandle (``.stop(grace)`` deregisters, keeps serving for serve()'s drain delay, then stops)."""
    from concurrent import futures

    import grpc

    import waypost
    from harness.backends import echo_pb2_grpc
    from harness.backends.server import EchoServicer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
    return waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry, metadata=metadata, grace=grace,
                         register_timeout=30.0)


_BACKEND_SCRIPT = """
import json, sys
from concurrent import futures
import grpc
import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer

name, key, registry = sys.argv[1:4]
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
handle = waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry, grace=5.0, register_timeout=30.0)
print(json.dumps({"ready": handle.address}), flush=True)
handle.wait()
print(json.dumps({"exited": name}), flush=True)
"""


def start_echo_process(name: str, key: str, registry: str, timeout: float = 60.0) -> PeerProc:
    """``waypost.serve`` of an Echo server in a Python process of its own (SIGTERM: its graceful stop)."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = PeerProc([sys.executable, "-c", _BACKEND_SCRIPT, name, key, registry], f"echo-{name}", env=env, cwd=ROOT)
    try:
        proc.expect(lambda d: "ready" in d, timeout, "ready")
    except BaseException:
        proc.stop()
        raise
    return proc


# -- xDS scenarios, run by tests/test_xds_go.py and tests/test_xds_java.py with their client --------------------

#: exports of the shared control plane: name -> export options after the target
SCENARIO_EXPORTS = {"bal": "", "hash": " policy=ring_hash hash_header=x-key", "term": "",
                    "wrr": " policy=client_side_weighted_round_robin", "pf": " policy=pick_first",
                    "lr": " policy=least_request"}
#: "eventually" bound for a registry change to reach a client's picks (measured: well under 1 s)
PROPAGATION_BOUND = 15.0


class XdsSetup:
    """One `waypost xds serve` over a real etcd, exporting SCENARIO_EXPORTS under keys of a unique prefix."""

    def __init__(self, etcd: Any) -> None:
        self.registry = etcd.url()
        prefix = f"xdsi{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.keys = {n: f"{prefix}-{n}.rpc" for n in SCENARIO_EXPORTS}
        exports = {n: f"etcd:///{etcd.endpoint}?key={self.keys[n]}{opt}" for n, opt in SCENARIO_EXPORTS.items()}
        self.addr, self.bootstrap, self.proc = xds_control_plane(exports)

    def close(self) -> None:
        self.proc.stop()


def watch(run: ClientRun, pred: Any, timeout: float, what: str) -> dict[str, Any]:
    """The first progress line whose counts satisfy ``pred`` (within ``timeout`` s); lines are kept in run.batches."""
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{run.name}: no batch with {what} within {timeout} s; last {seen[-5:]}; "
                                 f"stderr: {run.stderr_tail()}")
        line = run.progress(left)
        seen.append(line["counts"])
        if pred(line["counts"]):
            return line


def scenario_balance_and_registrations(lang: str, setup: XdsSetup) -> dict[str, float]:
    """Balance over every registered server (a weight 0 one gets nothing); an added registration, a removed one
    and a weight set to 0 reach the client's picks within PROPAGATION_BOUND; no call fails. Returns the
    measured delays (seconds from the registry change to the first batch showing it)."""
    key = setup.keys["bal"]
    handles = {n: serve_echo(n, key, setup.registry) for n in ("a", "b", "c")}
    handles["z"] = serve_echo("z", key, setup.registry, metadata={"weight": 0})
    figures: dict[str, float] = {}
    run = start_xds_client(lang, "xds:///bal", setup.bootstrap, 100_000, interval=0.004, batch=6, deadline=10.0)
    stoppers: list[threading.Thread] = []
    try:
        watch(run, lambda c: {"a", "b", "c"} <= set(c), 60.0, "a, b and c")
        # round robin over all three, none to the weight-0 one
        counts: dict[str, int] = {}
        for _ in range(5):
            for k, v in run.progress(30.0)["counts"].items():
                counts[k] = counts.get(k, 0) + v
        assert set(counts) == {"a", "b", "c"} and min(counts.values()) >= 6, counts

        handles["d"] = serve_echo("d", key, setup.registry)
        t0 = time.monotonic()
        line = watch(run, lambda c: "d" in c, PROPAGATION_BOUND, "the added server d")
        figures["added"] = line["_at"] - t0

        stopper = threading.Thread(target=handles.pop("a").stop, args=(3.0,), daemon=True)
        t0 = time.monotonic()
        stopper.start()  # deregisters at once, serves during the drain delay, then stops
        stoppers.append(stopper)
        line = watch(run, lambda c: "a" not in c and len(c) == 3, PROPAGATION_BOUND, "a gone")
        figures["removed"] = line["_at"] - t0

        t0 = time.monotonic()
        handles["b"].update_metadata({"weight": 0})
        line = watch(run, lambda c: "b" not in c and {"c", "d"} == set(c), PROPAGATION_BOUND, "b drained (weight 0)")
        figures["weight0"] = line["_at"] - t0
        for _ in range(3):
            assert set(run.progress(30.0)["counts"]) == {"c", "d"}
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        for t in stoppers:
            t.join(15)
        for h in handles.values():
            h.stop(0)
    assert final["errors"] == 0, final
    assert "z" not in final["counts"], final["counts"]
    print(f"\n{lang} xDS client over etcd: {final['calls']} calls, 0 failed, {final['counts']}; registry change -> "
          f"picks (first batch showing it, batches of 6 calls at ~4 ms): "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in figures.items()))
    return figures


def scenario_ring_hash_header(lang: str, setup: XdsSetup) -> dict[str, dict[str, int]]:
    """ring_hash on the x-key header: every key stays on one backend, and the keys spread over several."""
    key = setup.keys["hash"]
    handles = {n: serve_echo(n, key, setup.registry) for n in ("h1", "h2", "h3")}
    try:
        # ring_hash queues a pick whose backend is still connecting (gRFC A42): even the first calls keep to it.
        # The first call's deadline also covers the JVM's xDS resolution on loaded cores: a long one
        result = run_xds_client(lang, "xds:///hash", setup.bootstrap, 160, headers={"x-key": "user-{i}"},
                                keys=16, wait_for_ready=True, deadline=30.0, timeout=90)
    finally:
        for h in handles.values():
            h.stop(0)
    by_key: dict[str, dict[str, int]] = result["by_key"]
    assert result["errors"] == 0, result
    assert len(by_key) == 16 and all(sum(v.values()) == 10 for v in by_key.values()), by_key
    split = {k: v for k, v in by_key.items() if len(v) != 1}
    assert not split, f"keys reached more than one backend: {split}"
    owners = {next(iter(v)) for v in by_key.values()}
    print(f"\n{lang} ring_hash on x-key: 16 keys x 10 calls, each key on one backend; keys per backend: "
          f"{ {o: sum(1 for v in by_key.values() if o in v) for o in sorted(owners)} }")
    assert len(owners) >= 2, by_key
    return by_key


def scenario_graceful_sigterm(lang: str, setup: XdsSetup) -> None:
    """SIGTERM to a waypost.serve backend process under the client's load: it deregisters, the push reaches the
    client within serve()'s drain delay, then it stops: no call fails, and after its exit only the other is used."""
    key = setup.keys["term"]
    procs = [start_echo_process(n, key, setup.registry) for n in ("t1", "t2")]
    run = start_xds_client(lang, "xds:///term", setup.bootstrap, 100_000, interval=0.002, batch=10, deadline=10.0)
    try:
        watch(run, lambda c: {"t1", "t2"} <= set(c), 60.0, "t1 and t2")
        t_term = time.monotonic()
        procs[0].terminate()
        assert procs[0].proc.wait(20) == 0
        t_exit = time.monotonic()
        after: list[dict[str, Any]] = []  # batches wholly after its exit (earlier ones may still be queued)
        deadline = time.monotonic() + 30.0
        while len(after) < 5:
            line = run.progress(max(deadline - time.monotonic(), 0.1))
            if line["_at"] > t_exit + 0.2:
                after.append(line)
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        for p in procs:
            p.stop()
    assert final["errors"] == 0, final
    assert all(set(b["counts"]) == {"t2"} for b in after), after
    last_t1 = max((b["_at"] for b in final["batches"] if "t1" in b["counts"]), default=t_term)
    print(f"\n{lang} graceful SIGTERM of a backend: {final['calls']} calls, 0 failed; t1 last seen in a batch "
          f"{max(last_t1 - t_term, 0) * 1000:.0f} ms after SIGTERM, it exited after {(t_exit - t_term) * 1000:.0f} ms")


def scenario_wrr_from_waypost_orca(lang: str, setup: XdsSetup) -> dict[str, Any]:
    """client_side_weighted_round_robin over xDS, weights from waypost servers' own ORCA reports (per-call
    trailer; waypost.serve mounts the reporter): cpu 0.9/0.3/0.1 and 100 rps set on their recorders -> the
    client splits 600 calls about 46/138/415 once its weights are in (blackout 1 s, weight update 1 s)."""
    import waypost.orca

    if not waypost.orca.available():
        pytest.skip("waypost servers report no ORCA without xds-protos (pip install waypost[xds])")
    key = setup.keys["wrr"]
    handles = {}
    try:
        for name, cpu in A58_LOADS.items():
            h = handles[name] = serve_echo(f"w-{name}", key, setup.registry)
            rec = waypost.orca.server_recorder(h)
            rec.set_cpu_utilization(cpu)
            rec.set_qps(100.0)
        result = run_xds_client(lang, "xds:///wrr", setup.bootstrap, 2400, batch=600, interval=0.0015,
                                deadline=30.0, timeout=120)
    finally:
        for h in handles.values():
            h.stop(0)
    assert result["errors"] == 0, result
    check_a58_split(result["batches"][-1]["counts"], f"{lang} xDS client_side_weighted_round_robin over waypost "
                    "ORCA, last 600 calls", prefix="w-")
    return result


def scenario_pick_first_and_least_request(lang: str, setup: XdsSetup) -> dict[str, dict[str, int]]:
    """The exported policies pick_first and least_request (docs/xds.md's table) are accepted: pick_first sends
    every call to one backend, least_request spreads them; no call fails."""
    handles = [serve_echo(f"{export}{i}", setup.keys[export], setup.registry) for export in ("pf", "lr")
               for i in (1, 2, 3)]
    try:
        runs = {export: start_xds_client(lang, f"xds:///{export}", setup.bootstrap, 60, wait_for_ready=True,
                                         deadline=30.0, max_time=90.0) for export in ("pf", "lr")}
        results = {export: run.finish(120.0) for export, run in runs.items()}
    finally:
        for h in handles:
            h.stop(0)
    print(f"\n{lang} pick_first: {results['pf']['counts']}; least_request: {results['lr']['counts']}")
    for export, result in results.items():
        assert result["errors"] == 0 and result["calls"] == 60, (export, result)
    assert len(results["pf"]["counts"]) == 1, results["pf"]
    assert len(results["lr"]["counts"]) >= 2, results["lr"]
    return {export: r["counts"] for export, r in results.items()}


def scenario_name_not_exported(lang: str, setup: XdsSetup) -> dict[str, Any]:
    """A typo'd ``xds:///NAME`` (not exported) fails with UNAVAILABLE naming it within a 10 s deadline (a JVM's first xDS resolution takes seconds on loaded cores), shorter
    than the client's 15 s does-not-exist timer (unanswered, the call ended DEADLINE_EXCEEDED)."""
    result = run_xds_client(lang, "xds:///greter", setup.bootstrap, 1, deadline=10.0, timeout=60)
    print(f"\n{lang} xDS client, a name not exported: {result.get('codes')} after {result['seconds'] * 1000:.0f} ms "
          f"(process start to end): {result.get('first_error', '')[:200]}")
    codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}  # grpc-go: Unavailable
    assert result["errors"] == 1 and codes == {"UNAVAILABLE": 1}, result
    assert "greter" in result.get("first_error", ""), result
    return result
