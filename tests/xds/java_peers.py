"""grpc-java's xDS client (``interop/xds-java``, a Maven project on grpc-java 1.85.1), built once: classes
plus ``classpath.txt`` (jars in ~/.m2) in ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/xds-java-<hash>/``,
keyed by a hash of the sources and the JDK's version, under a file lock, niced, bounded
(``WAYPOST_XDS_JAVA_BUILD_TIMEOUT``). Tests skip with the reason when java / javac / mvn are missing, or with
``WAYPOST_INTEROP=0``; a failed build fails them. Cold ~40 s (Maven 29-39 s into an empty ~/.m2 part, javac ~8 s).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness.go_servers import servers_cache
from tests.xds.peer_procs import ROOT, TEST_TIMEOUT, BuildError, run_build

JAVA_DIR = ROOT / "interop" / "xds-java"
JAVA_MAIN = "waypost.interop.XdsClient"
JAVA_BUILD_TIMEOUT = float(os.environ.get("WAYPOST_XDS_JAVA_BUILD_TIMEOUT", "600"))


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
                run_build(["mvn", "-q", "-B", "dependency:build-classpath",
                            f"-Dmdep.outputFile={out / 'classpath.txt'}"],
                           work, env, logf, deadline - time.monotonic(), "mvn dependency:build-classpath")
                mvn_seconds = time.monotonic() - started
                sources = sorted(str(p) for p in (work / "src").rglob("*.java"))
                classpath = (out / "classpath.txt").read_text().strip()
                javac = shutil.which("javac") or str(Path(java).parent / "javac")
                run_build([javac, "--release", "17", "-d", str(out / "classes"), "-cp", classpath, *sources],
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
