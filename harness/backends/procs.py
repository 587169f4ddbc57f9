"""Run Echo servers as subprocesses (for SIGKILL / SIGSTOP tests and benchmarks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from waypost.etcd.local import _wait_stopped

ROOT = Path(__file__).resolve().parents[2]


class EchoProcess:
    """``python -m harness.backends.server`` in a child process; ``.port`` once it printed it."""

    def __init__(self, name: str, port: int = 0, delay_ms: int = 0, no_health: bool = False,
                 workers: int = 32, start_timeout: float = 60.0) -> None:
        self.name = name
        cmd = [sys.executable, "-m", "harness.backends.server", "--port", str(port), "--name", name,
               "--delay-ms", str(delay_ms), "--workers", str(workers)]
        if no_health:
            cmd.append("--no-health")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + start_timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("PORT ") or not line:
                break
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"echo server {name} did not start (got {line!r})")
        self.port = int(line.split()[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP, returning once the process is stopped (delivery is asynchronous)."""
        self.proc.send_signal(signal.SIGSTOP)
        _wait_stopped(self.proc.pid, 5.0)

    def resume(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        if self.proc.stdout:
            self.proc.stdout.close()


def spawn_many(names: list[str], **kw) -> list[EchoProcess]:
    """Start several servers (killing the ones started so far if one fails)."""
    out: list[EchoProcess] = []
    try:
        for n in names:
            out.append(EchoProcess(n, **kw))
    except Exception:
        for p in out:
            p.close()
        raise
    return out
