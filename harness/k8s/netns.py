"""Kubernetes scenarios inside a private network namespace: Kubernetes refuses loopback addresses in
EndpointSlices, so ``NetnsHost`` runs ``harness/k8s/netns_host.py`` under ``unshare -n`` (and, where permitted, a PID
namespace of its own) with pods on 10.77.0.2-9 of the namespace's own lo, and runs scenarios of
``harness/k8s/scenarios.py`` there, one at a time, each bounded.

The host process is started by this module and stopped by it by its PID (it stops its cluster first when its
stdin closes); ``harness/proc_reaper.py`` stops a host still running when the test process ends, killed or not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import proc_reaper
from harness.k8s.build import apiserver_binary

log = logging.getLogger("harness.k8s.netns")

ROOT = Path(__file__).resolve().parents[2]
#: the addresses NetnsHost puts on the private namespace's lo (never use them outside such a namespace)
POD_ADDRESSES = tuple(f"10.77.0.{i}" for i in range(2, 10))


def netns_skip_reason() -> str | None:
    """Why a private network namespace cannot be made here (no ``ip``, no ``unshare``, not permitted), or None."""
    if shutil.which("ip") is None:
        return "ip (iproute2) missing"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) missing"
    try:
        p = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True,
                           text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unshare -n is not permitted here: {e}"
    if p.returncode != 0:
        return f"unshare -n is not permitted here: {(p.stderr or p.stdout).strip()[:300]}"
    return None


def _pid_namespace_ok() -> bool:
    """Whether ``unshare -p -f --kill-child --mount-proc`` works: then the host is PID 1 of its own PID
    namespace and the kernel kills everything it started when it dies, however it dies."""
    try:
        p = subprocess.run(["unshare", "-n", "-p", "-f", "--kill-child", "--mount-proc", "true"],
                           capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0


class NetnsHost:
    """``harness/k8s/netns_host.py`` in a private network namespace, driven over JSON lines (see that module).

    Build the apiserver before ``start()``: there is no network inside. ``run(name)`` raises AssertionError
    with the scenario's traceback and the host's recent stderr when it fails; a host that died (or was ended
    after a timeout) is started again by the next ``run``.
    """

    def __init__(self, binary: str | os.PathLike[str] | None = None, log_dir: str | os.PathLike[str] | None = None,
                 ready_timeout: float = 90.0, addresses: Sequence[str] = POD_ADDRESSES,
                 host_args: Sequence[str] = ()) -> None:
        self.binary = Path(binary) if binary else None
        self._own_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="waypost-netns-"))
        self.ready_timeout = ready_timeout
        self.addresses = tuple(addresses)
        self.host_args = list(host_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.starts = 0
        self.startup_seconds: float | None = None
        self._lines: queue.Queue[Any] = queue.Queue()
        self._stderr_path: Path | None = None
        self._stderr: Any = None
        self._pidns: bool | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        setup = ["ip link set lo up", *(f"ip addr add {a}/32 dev lo" for a in self.addresses)]
        inner = " && ".join([*setup, 'exec "$0" -m harness.k8s.netns_host "$@"'])
        if self._pidns is None:
            self._pidns = _pid_namespace_ok()
        isolate = ["-n", "-p", "-f", "--kill-child", "--mount-proc"] if self._pidns else ["-n"]
        return ["unshare", *isolate, "bash", "-c", inner, sys.executable,
                "--dir", str(self.log_dir / f"cluster-{self.starts}"), *self.host_args]

    def start(self) -> NetnsHost:
        if self.alive:
            return self
        if self.binary is None:
            self.binary = apiserver_binary()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
        env["WAYPOST_KUBE_APISERVER"] = str(self.binary)
        env["PYTHONUNBUFFERED"] = "1"
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy",
                  "ALL_PROXY"):
            env.pop(k, None)  # nothing outside is reachable from inside
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1  # each host start gets a log and a cluster directory of its own in log_dir
        self._stderr_path = self.log_dir / f"netns-host-{self.starts}.log"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 (closed in _reap)
        self._lines = queue.Queue()
        started = time.monotonic()
        log.info("starting %s", shlex.join(self.command()))
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        proc_reaper.track(self, self.stop)  # a test run that forgot stop(), or was killed, waits for the host
        threading.Thread(target=self._read, args=(self.proc, self._lines), name="netns-host-stdout",
                         daemon=True).start()
        try:
            line = self._expect(lambda d: "ready" in d, self.ready_timeout, "the ready line")
        except AssertionError:
            self.stop()
            raise
        if not line.get("ready"):
            self.stop()
            raise AssertionError(f"netns host failed to start: {line.get('error')}\n{self.stderr_tail()}")
        self.ready = line
        self.startup_seconds = time.monotonic() - started
        return self

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], lines: queue.Queue[Any]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                lines.put(json.loads(text))
            except ValueError:
                log.debug("netns host stdout: %s", text)
        lines.put(None)

    def stderr_tail(self, n: int = 4000) -> str:
        if self._stderr_path is None:
            return ""
        with contextlib.suppress(ValueError, OSError):
            self._stderr.flush()
        try:
            return self._stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _expect(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"netns host: no {what} within {timeout:.0f} s; "
                                     f"stderr:\n{self.stderr_tail()}")
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self._lines.put(None)
                code = self.proc.wait(10) if self.proc is not None else None
                raise AssertionError(f"netns host exited (code {code}) before {what}; "
                                     f"stderr:\n{self.stderr_tail()}")
            if isinstance(line, dict) and pred(line):
                return line

    def run(self, name: str, timeout: float = 60.0, args: Mapping[str, Any] | None = None) -> None:
        """Run scenario ``name`` inside (bounded by ``timeout`` s there); AssertionError when it fails."""
        if not self.alive:
            if self.proc is not None:
                log.warning("netns host died (code %s); starting it again", self.proc.returncode)
                self._reap()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        request = {"scenario": name, "timeout": timeout, **({"args": dict(args)} if args else {})}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self._reap()
            raise AssertionError(f"netns host gone before scenario {name}: {e}\n{self.stderr_tail()}") from e
        try:
            # the host bounds the scenario itself; the margin covers reporting it (and its own slowness)
            answer = self._expect(lambda d: "ok" in d, timeout + 30.0, f"answer to scenario {name}")
        except AssertionError:
            self._kill()
            raise
        if not answer["ok"]:
            error = answer.get("error", "")
            if not self.alive or answer.get("exiting"):
                self._reap(wait=30.0)
            raise AssertionError(f"scenario {name} failed inside the private netns:\n{error}\n"
                                 f"--- netns host stderr (tail; all of it in {self._stderr_path}, the "
                                 f"apiserver's log in {self.log_dir}/cluster-{self.starts}) ---\n"
                                 f"{self.stderr_tail()}")

    def _kill(self) -> None:
        """End the host now: with the PID namespace, SIGKILL of unshare takes everything inside with it."""
        if self.proc is not None and self.proc.poll() is None:
            if not self._pidns:  # plain netns: let the host stop etcd and the apiserver first
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(30)
            if self.proc.poll() is None:
                self.proc.kill()
        self._reap()

    def _reap(self, wait: float = 10.0) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(wait)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    if f is not None:
                        f.close()
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()

    def stop(self, timeout: float = 45.0) -> None:
        """Close stdin (the host stops its cluster and exits), wait up to ``timeout`` s, then kill."""
        proc_reaper.untrack(self)
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("netns host did not exit within %s s after stdin closed; killing it", timeout)
                self._kill()
        self._reap()
        if self._own_dir and os.environ.get("WAYPOST_K8S_KEEP") != "1":
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> NetnsHost:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["POD_ADDRESSES", "NetnsHost", "netns_skip_reason"]
