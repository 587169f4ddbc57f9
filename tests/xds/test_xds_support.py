"""Helpers of the xDS tests (no tests here): the stock grpcio client process, ``waypost xds serve`` as a process,
registered Echo servers.

The stock client (``STOCK_CLIENT``) is a separate Python process that imports only ``grpc`` and the Echo stubs:
no waypost code takes part in its calls. It reads commands on stdin and answers one JSON line each:

- ``calls NAME N [HEADER=VALUE|-] [TIMEOUT] [DELAY_MS] [FAIL_ON|-]``: N unary calls (the server sleeps DELAY_MS
  in each; the servers named in FAIL_ON end them with UNAVAILABLE) on ``xds:///NAME``: ``{"servers": {name: count}, "errors": [...]}``;
- ``timed NAME TIMEOUT``: one call: ``{"server": name or "", "code": "OK" or the status code,
  "details": the status details, "seconds": how long it took}``;
- ``start NAME [PAUSE_MS]``: calls in a background thread until ``stop``, which answers
  ``{"events": [[monotonic time, server or "!CODE"], ...]}`` (CLOCK_MONOTONIC is system-wide on Linux);
- ``quit``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.backends.server import EchoServer
from harness.waiting import wait_until
from waypost import Publisher

ROOT = Path(__file__).resolve().parents[2]

STOCK_CLIENT = r'''
import json, sys, threading, time
import grpc
from harness.backends import echo_pb2, echo_pb2_grpc

stubs = {}
def stub(name):
    if name not in stubs:
        stubs[name] = echo_pb2_grpc.EchoStub(grpc.insecure_channel("xds:///" + name))
    return stubs[name]

def one(name, md=None, timeout=5.0, delay_ms=0, fail_on=""):
    try:
        req = echo_pb2.EchoRequest(message="x", delay_ms=delay_ms, fail_on=fail_on, error_code=14 if fail_on else 0)
        return stub(name).Unary(req, timeout=timeout, metadata=md).server
    except grpc.RpcError as e:
        return "!" + e.code().name

loop = {}
def run(name, pause):
    ev = loop["events"]
    while not loop["stop"].is_set():
        ev.append((time.monotonic(), one(name)))
        if pause:
            time.sleep(pause)

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "calls":
        md = [tuple(cmd[3].split("=", 1))] if len(cmd) > 3 and cmd[3] != "-" else None
        timeout = float(cmd[4]) if len(cmd) > 4 else 5.0
        delay_ms = int(cmd[5]) if len(cmd) > 5 else 0
        fail_on = cmd[6] if len(cmd) > 6 and cmd[6] != "-" else ""
        counts, errors = {}, []
        for _ in range(int(cmd[2])):
            s = one(cmd[1], md, timeout, delay_ms, fail_on)
            if s.startswith("!"):
                errors.append(s)
            else:
                counts[s] = counts.get(s, 0) + 1
        print(json.dumps({"servers": counts, "errors": errors}), flush=True)
    elif cmd[0] == "timed":
        started = time.monotonic()
        try:
            reply = stub(cmd[1]).Unary(echo_pb2.EchoRequest(message="x"), timeout=float(cmd[2]))
            out = {"server": reply.server, "code": "OK", "details": ""}
        except grpc.RpcError as e:
            out = {"server": "", "code": e.code().name, "details": e.details() or ""}
        out["seconds"] = time.monotonic() - started
        print(json.dumps(out), flush=True)
    elif cmd[0] == "start":
        loop.update(events=[], stop=threading.Event())
        pause = float(cmd[2]) / 1000 if len(cmd) > 2 else 0.002
        loop["thread"] = threading.Thread(target=run, args=(cmd[1], pause), daemon=True)
        loop["thread"].start()
        print(json.dumps({"started": True}), flush=True)
    elif cmd[0] == "stop":
        loop["stop"].set()
        loop["thread"].join(30)
        print(json.dumps({"events": loop["events"]}), flush=True)
    elif cmd[0] == "quit":
        break
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class XdsServe:
    """``python -m waypost.cli xds serve --listen 127.0.0.1:PORT --export ...`` as a child process."""

    def __init__(self, exports: list[str], port: int = 0, extra: tuple[str, ...] = (), log: Path | None = None,
                 registry: str | None = None):
        self.exports, self.extra, self.log_path = exports, extra, log
        self.registry = registry
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        """Start it (again, after ``kill()``: on the port it had)."""
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        glob = ["--registry", self.registry] if self.registry else []
        cmd = [sys.executable, "-m", "waypost.cli", "-v", *glob, "xds", "serve", "--listen",
               f"127.0.0.1:{self.port}", *self.extra]
        for e in self.exports:
            cmd += ["--export", e]
        err = open(self.log_path, "a") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("xds: serving on "):
            self.proc.kill()
            raise RuntimeError(f"xds serve did not start: {line!r} {self.log()[-2000:]}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap(self) -> str:
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server", self.address],
                             cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60, check=True)
        return out.stdout

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def close(self) -> None:
        self.kill()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()


class StockClient:
    """The stock grpcio client process (module docstring), pointed at ``bootstrap``."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        script = tmp / "stock_client.py"
        script.write_text(STOCK_CLIENT)
        self.proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_env(GRPC_XDS_BOOTSTRAP_CONFIG=bootstrap))
        assert self.ask_raw(None) == {"ready": True}

    def ask_raw(self, line: str | None) -> Any:
        assert self.proc.stdin and self.proc.stdout
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"stock client exited ({self.proc.poll()})")
        return json.loads(out)

    def calls(self, name: str, n: int, header: str | None = None, timeout: float = 5.0,
              delay_ms: int = 0, fail_on: str = "") -> dict[str, Any]:
        return self.ask_raw(f"calls {name} {n} {header or '-'} {timeout} {delay_ms} {fail_on or '-'}")

    def timed(self, name: str, timeout: float) -> dict[str, Any]:
        """One call: its server or status code and details, and how long it took."""
        return self.ask_raw(f"timed {name} {timeout}")

    def start(self, name: str, pause_ms: float = 2) -> None:
        self.ask_raw(f"start {name} {pause_ms}")

    def stop(self) -> list[tuple[float, str]]:
        return [tuple(e) for e in self.ask_raw("stop")["events"]]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


class Backends:
    """In-process Echo servers registered in a registry under one key (gozero format, with metadata)."""

    def __init__(self, registry_url: str, key: str) -> None:
        self.registry_url, self.key = registry_url, key
        self.servers: dict[str, EchoServer] = {}
        self.pubs: dict[str, Publisher] = {}
        self.lock = threading.Lock()

    def add(self, name: str, **metadata: Any) -> EchoServer:
        server = EchoServer(name).start()
        pub = Publisher(self.registry_url, self.key, server.address, ttl=10, metadata=metadata or None)
        pub.start()
        with self.lock:
            self.servers[name], self.pubs[name] = server, pub
        return server

    def deregister(self, name: str) -> float:
        """Stop the registration of ``name`` (its server keeps serving); returns the monotonic time it began."""
        began = time.monotonic()
        self.pubs.pop(name).stop()
        return began

    def close(self) -> None:
        for pub in self.pubs.values():
            pub.stop()
        for server in self.servers.values():
            server.stop(0)


@contextmanager
def stock_client(bootstrap: str, tmp: Path) -> Iterator[StockClient]:
    c = StockClient(bootstrap, tmp)
    try:
        yield c
    finally:
        c.close()


def picks_all(client: StockClient, name: str, servers: set[str], n: int = 30, timeout: float = 20) -> dict[str, int]:
    """Calls until every server in ``servers`` (and only those) answers within one batch of ``n``."""
    def ok() -> dict[str, int] | None:
        got = client.calls(name, n)
        return got["servers"] if set(got["servers"]) == servers and not got["errors"] else None

    return wait_until(ok, timeout, f"{name} picks exactly {sorted(servers)}", interval=0.05)
