"""The moving parts of a chaos scenario: backend processes (``harness/chaos/node.py``: an Echo server whose
ports are registered by waypost Publishers) and a balanced channel in this process under steady load through
``waypost.dial``. Loopback only; every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.chaos.observe import LOG
from harness.chaos.result import Result
from harness.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

Req = echo_pb2.EchoRequest

#: the clients' service config: round robin, retry UNAVAILABLE on another backend
RETRY_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 5, "initialBackoff": "0.02s", "maxBackoff": "0.2s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}


class Node:
    """A backend process (``harness/chaos/node.py``). Construct several, then ``ready()`` each: they start in
    parallel."""

    def __init__(self, registry_url: str | list[str], key: str, name: str, ports: int = 1, ttl: int = 10,
                 serve: bool = False) -> None:
        self.name = name
        urls = [registry_url] if isinstance(registry_url, str) else registry_url
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "harness" / "chaos" / "node.py"), *(a for u in urls for a in ("--registry", u)),
             "--key", key,
             "--name", name, "--ports", str(ports), "--ttl", str(ttl), *(["--serve"] if serve else [])],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addresses: list[str] = []

    def _line(self, prefix: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith(prefix):
                    result.append(line)
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not result:
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()[-2000:]
            raise RuntimeError(f"node {self.name}: no {prefix!r} line within {timeout} s {err}")
        return result[0]

    def ready(self, timeout: float = 60.0) -> Node:
        self.addresses = json.loads(self._line("READY ", timeout).split(" ", 1)[1])
        return self

    def churn(self, seconds: float, rate: float, seed: int) -> tuple[float, set[str]]:
        """Run the node's churn; returns (monotonic time it stopped, addresses registered then)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"churn {seconds} {rate} {seed}\n")
        self.proc.stdin.flush()
        _, t_end, live = self._line("LIVE ", seconds + 60).split(" ", 2)
        return float(t_end), set(json.loads(live))

    @property
    def address(self) -> str:
        return self.addresses[0]

    def quit(self, timeout: float = 30.0) -> bool:
        """Ask the node to stop gracefully; True if it exited within ``timeout``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def close(self) -> None:
        """Ask the node to deregister and exit; kill it if it does not within a few seconds."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


@contextlib.contextmanager
def nodes(registry_url: str | list[str], key: str, names: list[str], **kw: Any) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        for n in names:
            started.append(Node(registry_url, key, n, **kw))
        for n in started:
            n.ready()
        yield started
    finally:
        for n in started:
            n.close()


class Load:
    """``threads`` callers in a loop through ``stub`` until stopped; counts calls, failures and who answered."""

    def __init__(self, stub: Any, threads: int = 3, delay_ms: int = 2, timeout: float = 15.0) -> None:
        self.stub = stub
        self.sent = 0
        self.failed: list[tuple[float, str, str]] = []
        self.answers: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._delay_ms = delay_ms
        self._timeout = timeout
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = self.stub.Unary(Req(delay_ms=self._delay_ms), timeout=self._timeout)
            except grpc.RpcError as e:
                with self._lock:
                    self.sent += 1
                    self.failed.append((time.monotonic(), e.code().name, str(e.details())[:200]))
            except Exception as e:  # noqa: BLE001  # not an RpcError: a client-visible failure all the same
                with self._lock:
                    self.sent += 1
                    self.failed.append((time.monotonic(), type(e).__name__, str(e)[:200]))
            else:
                with self._lock:
                    self.sent += 1
                    self.answers.append((time.monotonic(), r.server))

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self._timeout + 10)

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def servers_after(self, t: float) -> set[str]:
        with self._lock:
            return {s for ts, s in self.answers if ts > t}

    def fill(self, r: Result) -> None:
        r.sent = self.sent
        r.failed = len(self.failed)
        if self.failed:
            r.details["failures"] = self.failed[:5]
            r.details["log_around_first_failure"] = LOG.around(self.failed[0][0])
        r.check(not self.failed, f"{len(self.failed)} of {self.sent} RPCs failed: {self.failed[:3]}")


@contextlib.contextmanager
def loaded_channel(target: str | list[str], *, threads: int = 3, warm: int = 1, **dial_kw: Any) -> Iterator[tuple[Any, Load]]:
    """A balanced channel under steady load (started once ``warm`` backends are READY); the library's log
    lines are recorded meanwhile to explain failures."""
    ch = waypost.dial(target, service_config=RETRY_CONFIG, **dial_kw)
    load = None
    try:
        with LOG.recording():
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) >= warm, 30, f"warm-up: {warm} backends READY")
            stub.Unary(Req(), timeout=30, wait_for_ready=True)
            load = Load(stub, threads=threads).start()
            wait_until(lambda: load.count() > 20, 20, "warm-up: 20 RPCs answered under load")
            try:
                yield ch, load
            finally:
                load.stop()
    finally:
        ch.close()


def etcd_target(endpoints: list[str], key: str) -> str:
    return f"etcd:///{','.join(endpoints)}?key={key}"
