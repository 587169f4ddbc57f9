"""A server started before its registry (docker compose, Kubernetes) waits for it up to ``register_timeout``.

Real gRPC servers and a real etcd started on a fixed, free port a few seconds after ``serve()`` began.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from waypost.etcd.local import LocalEtcd, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _server() -> grpc.Server:
    s = grpc.server(futures.ThreadPoolExecutor(4))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("late"), s)
    return s


def test_serve_waits_for_an_etcd_that_starts_later(tmp_path, unique_key):
    etcd_port = free_port()
    out: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["handle"] = waypost.serve(_server(), unique_key, listen_on="127.0.0.1:0",
                                          registry=f"etcd://127.0.0.1:{etcd_port}", register_timeout=30)
        except BaseException as e:  # noqa: BLE001  # reported by the test below
            out["error"] = e
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(3.0)  # serve() is trying meanwhile: connection refused
    assert t.is_alive(), f"serve() gave up before etcd started: {out}"
    etcd = LocalEtcd(1, base_dir=tmp_path / "etcd", client_ports=[etcd_port]).start()
    try:
        t.join(40)
        assert not t.is_alive(), "serve() did not return within its register_timeout"
        assert "error" not in out, out.get("error")
        handle = out["handle"]
        try:
            print(f"serve() returned {out['took']:.2f}s after it began (etcd started at 3 s)")
            key = handle.registered_key
            assert key is not None and key.startswith(unique_key + "/")
            got = wait_until(lambda: etcd.etcdctl("get", key, "--print-value-only").strip(), 10)
            assert got == handle.address
        finally:
            handle.stop(grace=1)
    finally:
        etcd.close()


def test_serve_without_etcd_fails_after_register_timeout_naming_the_cause(unique_key):
    etcd_port = free_port()
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(waypost.RegistryUnavailable) as info:
        waypost.serve(_server(), unique_key, listen_on=f"127.0.0.1:{port}",
                      registry=f"etcd://127.0.0.1:{etcd_port}", register_timeout=3)
    took = time.monotonic() - t0
    msg = str(info.value)
    print(f"serve() failed after {took:.2f}s: {msg}")
    assert 2.5 <= took <= 15, took  # it tried for about register_timeout, not once, and not forever
    assert f"127.0.0.1:{etcd_port}" in msg and "connection refused" in msg.lower(), msg
    assert "attempts" in msg, msg
    wait_until(lambda: not _accepts(port), 10, "the server's port to be closed again")


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False
