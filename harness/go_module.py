"""Programs of a Go module kept in this repository (``interop/xds``, ``bench/xds_scale``), built once and cached.

``GoModule(directory, programs, cache_name)`` builds ``go build ./cmd/...`` of ``directory`` into
``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/<cache_name>-<hash>/``, the hash covering go.mod, go.sum,
every ``.go`` file and the toolchain's version: a changed source builds again, an unchanged one is a hash and a
file check. The build runs niced in its own process group under a file lock (concurrent test processes build
once), bounded by a timeout; older builds of the same module are removed once a new one is in place.

``skip_reason()`` says why it cannot be built here (no Go, a Go older than go.mod asks); callers skip with it.
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
from dataclasses import dataclass
from pathlib import Path

from harness.go_servers import BuildError, build_env, go_binary, go_version, servers_cache
from harness.proc_reaper import wait_group


@dataclass(frozen=True)
class GoModule:
    directory: Path
    programs: tuple[str, ...]
    cache_name: str

    def source_hash(self, go: str) -> str:
        h = hashlib.sha256(go_version(go).encode())
        for p in [self.directory / "go.mod", self.directory / "go.sum", *sorted(self.directory.rglob("*.go"))]:
            h.update(str(p.relative_to(self.directory)).encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def out_dir(self, go: str) -> Path:
        return servers_cache() / f"{self.cache_name}-{self.source_hash(go)}"

    def skip_reason(self) -> str | None:
        go = go_binary()
        if go is None:
            return f"{self.directory.name} needs the Go toolchain: `go` is not on PATH (or set WAYPOST_GO)"
        want = re.search(r"^go (\d+)\.(\d+)", (self.directory / "go.mod").read_text(), re.MULTILINE)
        try:
            have = re.search(r"go(\d+)\.(\d+)", go_version(go))
        except (OSError, subprocess.SubprocessError) as e:
            return f"`{go} version` failed: {e}"
        if want and have and (int(have[1]), int(have[2])) < (int(want[1]), int(want[2])):
            return f"{self.directory} needs Go {want[1]}.{want[2]}+, {go} is go{have[1]}.{have[2]} (set WAYPOST_GO)"
        return None

    def is_built(self) -> bool:
        go = go_binary()
        try:
            return go is not None and all((self.out_dir(go) / n).is_file() for n in self.programs)
        except (OSError, subprocess.SubprocessError):
            return False

    def build(self, timeout: float) -> dict[str, Path]:
        """Build (or reuse) the programs; name -> binary. BuildError when the build fails or overruns."""
        reason = self.skip_reason()
        if reason:
            raise BuildError(reason)
        go = go_binary()
        assert go is not None
        out = self.out_dir(go)
        paths = {n: out / n for n in self.programs}
        if all(p.is_file() for p in paths.values()):
            return paths
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f"{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the binaries
            if all(p.is_file() for p in paths.values()):
                return paths
            self._build(go, out, timeout)
        return paths

    def _build(self, go: str, out: Path, timeout: float) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}-build-", dir=out.parent))
        log_path = out.parent / f"{out.name}.build.log"
        env = build_env(go)
        env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
        argv = [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp) + os.sep, "./cmd/..."]
        started = time.monotonic()
        try:
            with open(log_path, "wb") as logf:
                logf.write(f"$ {' '.join(argv)}\n".encode())
                logf.flush()
                # niced: a cold build takes minutes of both cores, and what runs beside it must keep time
                proc = subprocess.Popen(["nice", "-n", "10", *argv], cwd=self.directory, env=env, stdout=logf,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    rc = wait_group(proc, max(timeout, 1.0))
                except subprocess.TimeoutExpired:
                    raise BuildError(f"go build of {self.directory} took longer than {timeout:.0f} s; "
                                     f"log {log_path}") from None
            if rc != 0:
                tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                raise BuildError(f"go build of {self.directory} failed (exit {rc}); log {log_path}:\n{tail}")
            missing = [n for n in self.programs if not (tmp / n).is_file()]
            if missing:
                raise BuildError(f"go build of {self.directory} produced no binary for {missing}")
            (tmp / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in out.parent.glob(f"{self.cache_name}-*"):  # other source hashes are dead weight
                if old.is_dir() and old != out and "-build-" not in old.name:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
