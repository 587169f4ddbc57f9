"""The native xDS engine (``native/xds-engine``, a Rust extension module) built once and cached, for the benchmark
(``bench/xds_scale/native_server.py``) and its tests (``tests/xds/test_native_engine.py``).

``build(timeout)`` runs ``cargo build --release --locked`` (niced, in its own process group, under a file lock,
bounded by ``timeout``) with cargo's target directory in ``~/.cache/waypost-xds-engine-target`` (a rebuild after
a change of one file takes seconds, a cold one a few minutes), and copies the library as an importable
``waypost_xds_engine.abi3.so`` into ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/xds-engine-<hash>/``,
the hash covering Cargo.toml, Cargo.lock, the sources and the toolchain's version. It returns that directory: put
it first on ``sys.path`` (or PYTHONPATH) and ``import waypost_xds_engine``.

``skip_reason()`` says why it cannot be built here (no cargo); callers skip with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from harness.go_servers import BuildError, servers_cache
from harness.proc_reaper import wait_group

CRATE = Path(__file__).resolve().parent.parent / "native" / "xds-engine"
MODULE = "waypost_xds_engine"


def cargo_binary() -> str | None:
    found = os.environ.get("WAYPOST_CARGO") or shutil.which("cargo")
    if found:
        return found
    home = Path.home() / ".cargo" / "bin" / "cargo"  # rustup's place, often not on a non-login PATH
    return str(home) if home.is_file() else None


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or Path.home() / ".cache" / "waypost-xds-engine-target")


def skip_reason() -> str | None:
    if cargo_binary() is None:
        return "the native xDS engine needs Rust: `cargo` is not on PATH (https://rustup.rs, or set WAYPOST_CARGO)"
    return None


def _source_hash(cargo: str) -> str:
    rustc = Path(cargo).with_name("rustc")
    version = subprocess.run([str(rustc) if rustc.is_file() else "rustc", "--version"], check=False,
                             capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256(version.encode())
    for p in [CRATE / "Cargo.toml", CRATE / "Cargo.lock", *sorted((CRATE / "src").rglob("*.rs"))]:
        h.update(str(p.relative_to(CRATE)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(timeout: float = 900.0) -> Path:
    """The directory holding the built module (built now if its sources changed). BuildError on failure."""
    reason = skip_reason()
    if reason:
        raise BuildError(reason)
    cargo = cargo_binary()
    assert cargo is not None
    out = servers_cache() / f"xds-engine-{_source_hash(cargo)}"
    lib = out / f"{MODULE}.abi3.so"
    if lib.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the module
        if not lib.is_file():
            _build(cargo, out, timeout)
    return out


def _build(cargo: str, out: Path, timeout: float) -> None:
    log_path = out.parent / f"{out.name}.build.log"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target_dir())}
    env["PATH"] = os.pathsep.join([str(Path(cargo).parent), env.get("PATH", "")])
    argv = [cargo, "build", "--release", "--locked"]
    started = time.monotonic()
    with open(log_path, "wb") as logf:
        logf.write(f"$ {' '.join(argv)}\n".encode())
        logf.flush()
        # niced: a cold build takes minutes of both cores, and what runs beside it must keep time
        proc = subprocess.Popen(["nice", "-n", "10", *argv], cwd=CRATE, env=env, stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = wait_group(proc, max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            raise BuildError(f"cargo build of {CRATE} took longer than {timeout:.0f} s; log {log_path}") from None
    if rc != 0:
        tail = log_path.read_bytes()[-3000:].decode(errors="replace")
        raise BuildError(f"cargo build of {CRATE} failed (exit {rc}); log {log_path}:\n{tail}")
    built = target_dir() / "release" / f"lib{MODULE}.so"
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}-build-", dir=out.parent))
    try:
        shutil.copy2(built, tmp / f"{MODULE}.abi3.so")
        (tmp / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in out.parent.glob("xds-engine-*"):  # other source hashes are dead weight
        if old.is_dir() and old != out and "-build-" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
