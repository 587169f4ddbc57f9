"""The foreign peers' processes (Go binaries, JVMs, the waypost CLI): started and stopped here.

Every process is started here and stopped here by its PID (SIGTERM, SIGKILL after a bound): ``stop_started()``
(the ``xds_procs`` fixture calls it after each test) and ``harness/proc_reaper.py`` (at exit, and on SIGTERM/SIGHUP).
Build steps run niced in a process group of their own, bounded (``run_build``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pytest

from harness import proc_reaper
from harness.go_servers import BuildError as _HarnessBuildError
from tests.interop.support import GoProc

ROOT = Path(__file__).resolve().parents[2]

#: per-test bound once everything is built
TEST_TIMEOUT = 120.0
LOG_DIR = Path(tempfile.gettempdir()) / f"waypost-xds-interop-{os.getpid()}"


#: a build failed (a real failure, not a skip): one class for every builder (harness.go_module's too)
BuildError = _HarnessBuildError


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


def run_build(argv: Sequence[str], cwd: Path, env: Mapping[str, str], logf: Any, limit: float, what: str) -> None:
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


def go_duration(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 0)}ms"
