"""Console tests: a real ``waypost console`` (its own thread and event loop) and plain HTTP calls to it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer
from waypost.console import Console, ConsoleConfig
from waypost.server import serve

TOKEN = "test-token-0123456789"


@contextmanager
def running_console(**kw: Any) -> Iterator[tuple[Console, str]]:
    """A console on a free loopback port until the block ends; yields it and its URL."""
    kw.setdefault("listen", "127.0.0.1:0")
    kw.setdefault("token", TOKEN)
    kw.setdefault("health_interval", 1.0)
    console = Console(ConsoleConfig(**kw))
    stop = threading.Event()
    started: futures.Future[str] = futures.Future()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            console.run(stop, started.set_result)
        except BaseException as e:  # noqa: BLE001 (raised in the test's thread)
            failed.append(e)
            if not started.done():
                started.set_exception(e)

    t = threading.Thread(target=run, name="test-console", daemon=True)
    t.start()
    try:
        yield console, started.result(timeout=20)
    finally:
        stop.set()
        t.join(20)
        assert not t.is_alive(), "the console did not stop"
    assert not failed, failed


def http(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one request; error statuses are returned, not raised."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def write(url: str, verb: str, body: dict[str, Any], token: str | None = TOKEN, **headers: str) -> tuple[int, Any]:
    h = dict(headers)
    if token is not None:
        h["X-Waypost-Token"] = token
    return http(f"{url}api/{verb}", "POST", body, h)


def instances(url: str, key: str) -> dict[str, dict[str, Any]]:
    """address -> instance, of every service shown under ``key``."""
    _, snap = http(f"{url}api/services")
    return {i["address"]: i for s in snap["services"] if s["key"] == key for i in s["instances"]}


def echo_serve(name: str, key: str, registry: Any, **kw: Any) -> Any:
    """A real ``waypost.serve`` Echo server named ``name`` on a free loopback port."""
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
    kw.setdefault("grace", 0)
    kw.setdefault("drain_delay", 0)
    return serve(server, key, registry=registry, listen_on="127.0.0.1:0", **kw)
