"""Real servers built from the Go module proxy for the tests (kube-apiserver, consul): once, cached, locked.

``GoServer(name, version, script, ...)`` describes one: ``binary()`` builds it with ``script`` (a bash recipe
run in an empty directory, producing ``./<name>``) into
``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/<name>-<version>-<hash of go version>/<name>``, with the
build log beside it, under a file lock so that concurrent test processes build it once, bounded by a timeout
(the build's process group is killed past it, and when the test run ends first). ``$<env_binary>`` names an
already built binary instead. ``skip_reason()`` says why it cannot be had here (no Go, a Go too old); tests skip
with it.

``go_binary()`` is also the interop programs' toolchain (tests/interop/support.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.proc_reaper import wait_group

#: Go's standard install location, for environments whose PATH lacks it
GO_DEFAULT = Path("/usr/local/go/bin/go")


def go_binary() -> str | None:
    """The ``go`` command: ``$WAYPOST_GO``, else ``go`` on PATH, else ``/usr/local/go/bin/go``."""
    env = os.environ.get("WAYPOST_GO")
    if env:
        return env if Path(env).exists() else None
    return shutil.which("go") or (str(GO_DEFAULT) if GO_DEFAULT.exists() else None)


def go_version(go: str) -> str:
    return subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def servers_cache() -> Path:
    """Where built and fetched test servers are kept across runs (and clones)."""
    return Path(os.environ.get("WAYPOST_SERVERS_CACHE") or Path.home() / ".cache" / "waypost-servers")


def build_env(go: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GOFLAGS", None)  # the recipes set their own per command
    env.setdefault("GOTOOLCHAIN", "local")  # never fetch another toolchain behind the test's back
    # the recipes call `go` and `python3`: this toolchain and this interpreter come first
    env["PATH"] = os.pathsep.join([str(Path(go).parent), str(Path(sys.executable).parent), env.get("PATH", "")])
    if not env.get("HOME"):
        env.setdefault("GOCACHE", str(servers_cache() / ".gocache"))
        env.setdefault("GOPATH", str(servers_cache() / ".gopath"))
    return env


class Unavailable(RuntimeError):
    """The server cannot be had on this machine (the message says why): tests skip with it."""


class BuildError(RuntimeError):
    """Building it failed (a real failure, not a skip)."""


@dataclass(frozen=True)
class GoServer:
    name: str  # the binary's name, and the recipe's output file
    version: str
    script: str
    env_binary: str  # the variable naming an already built binary
    timeout_env: str  # the variable overriding the build timeout
    default_timeout: float
    min_go: tuple[int, int]

    def prebuilt(self) -> Path | None:
        env = os.environ.get(self.env_binary)
        return Path(env) if env else None

    def path(self, go: str) -> Path:
        """Where the binary for this Go toolchain lives (built or not)."""
        digest = hashlib.sha256(go_version(go).encode()).hexdigest()[:12]
        return servers_cache() / f"{self.name}-{self.version}-{digest}" / self.name

    def build_timeout(self) -> float:
        return float(os.environ.get(self.timeout_env, str(self.default_timeout)))

    def skip_reason(self) -> str | None:
        pre = self.prebuilt()
        if pre is not None:
            if not (pre.is_file() and os.access(pre, os.X_OK)):
                return f"{self.env_binary}={str(pre)!r} is not an executable file"
            return None
        go = go_binary()
        if go is None:
            return f"no Go toolchain to build {self.name} {self.version} (install Go or set WAYPOST_GO)"
        try:
            version = go_version(go)
        except (OSError, subprocess.SubprocessError) as e:
            return f"`{go} version` failed: {e}"
        m = re.search(r"go(\d+)\.(\d+)", version)
        if m and (int(m[1]), int(m[2])) < self.min_go:
            return (f"{version}: {self.name} {self.version} needs Go {self.min_go[0]}.{self.min_go[1]} or newer "
                    "(set WAYPOST_GO)")
        return None

    def is_built(self) -> bool:
        pre = self.prebuilt()
        if pre is not None:
            return pre.is_file()
        go = go_binary()
        try:
            return go is not None and self.path(go).is_file()
        except (OSError, subprocess.SubprocessError):
            return False

    def binary(self, timeout: float | None = None) -> Path:
        """The binary, built once per Go toolchain (concurrent callers wait for one build). Unavailable when it
        cannot be built here, BuildError when the build fails or exceeds its timeout."""
        pre = self.prebuilt()
        if pre is not None:
            if not pre.is_file():
                raise Unavailable(f"{self.env_binary}={str(pre)!r} does not exist")
            return pre
        reason = self.skip_reason()
        if reason is not None:
            raise Unavailable(reason)
        go = go_binary()
        assert go is not None
        target = self.path(go)
        if target.is_file():
            return target
        out = target.parent
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f"{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the binary
            if target.is_file():
                return target
            self._build(go, out, target, self.build_timeout() if timeout is None else timeout)
        return target

    def _build(self, go: str, out: Path, target: Path, limit: float) -> None:
        out.mkdir(exist_ok=True)
        work = out / "build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "build.sh").write_text(self.script)
        log_path = out / "build.log"
        started = time.monotonic()
        with open(log_path, "wb") as logf:
            logf.write(f"# {go_version(go)}; {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            logf.flush()
            # niced: a cold build takes minutes of both cores, and the tests that run beside it must keep time
            proc = subprocess.Popen(["nice", "-n", "15", "bash", "build.sh"], cwd=work, env=build_env(go),
                                    stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                rc = wait_group(proc, limit)  # the build's own process group (go, compile, link)
            except subprocess.TimeoutExpired:
                raise BuildError(f"building {self.name} took longer than {limit:.0f} s ({self.timeout_env}); "
                                 f"log: {log_path}") from None
            seconds = time.monotonic() - started
            logf.write(f"rc={rc} seconds={seconds:.1f}\n".encode())
        if rc != 0 or not (work / self.name).is_file():
            tail = log_path.read_bytes()[-3000:].decode(errors="replace")
            raise BuildError(f"building {self.name} failed (exit {rc}); log {log_path}:\n{tail}")
        os.replace(work / self.name, target)
        (out / "build-seconds").write_text(f"{seconds:.1f}\n")
        shutil.rmtree(work, ignore_errors=True)
