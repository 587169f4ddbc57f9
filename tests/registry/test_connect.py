"""connect(url): parsing, sharing, single-flight creation, fork, and bad URLs."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.etcd.helpers import run
from waypost.discovery.connections import connect
from waypost.discovery.registry_url import parse_registry_url
from waypost.errors import InvalidTarget, RegistryUnavailable
from waypost.etcd.local import free_port
from waypost.registries.etcd.store import EtcdRegistry


def test_parse_etcd_url_normalizes_and_hides_the_password():
    u = parse_registry_url("etcd://alice:p%40ss@h1:2379,127.0.0.1,[::1]:2380?dial_timeout=1.5")
    assert u.endpoints == ("h1:2379", "127.0.0.1:2379", "[::1]:2380")
    assert (u.username, u.password, u.dial_timeout, u.tls) == ("alice", "p@ss", 1.5, False)
    assert "p@ss" not in repr(u) and "p@ss" not in u.redacted and "p%40ss" not in u.redacted
    assert u.redacted == "etcd://alice:***@h1:2379,127.0.0.1:2379,[::1]:2380?dial_timeout=1.5"


def test_same_url_same_object_and_endpoint_order_does_not_matter():
    a = connect("etcd://127.0.0.1:23790,127.0.0.1:23791")
    try:
        assert connect("etcd://127.0.0.1:23791,127.0.0.1:23790") is a
        assert connect(" etcd://127.0.0.1:23790,127.0.0.1:23791 ") is a
        assert connect("etcd://u:p@127.0.0.1:23790,127.0.0.1:23791") is not a
        assert isinstance(a, EtcdRegistry)
    finally:
        run(a.close())
    assert connect("etcd://127.0.0.1:23790,127.0.0.1:23791") is not a


def test_single_flight_under_16_threads():
    url = f"etcd://127.0.0.1:{free_port()}"
    barrier = threading.Barrier(16)
    got: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait(10)
        r = connect(url)
        with lock:
            got.append(r)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 16 and len({id(r) for r in got}) == 1
    run(got[0].close())  # type: ignore[attr-defined]


def test_connect_does_not_touch_the_network_and_first_call_fails_fast():
    url = f"etcd://127.0.0.1:{free_port()}?dial_timeout=0.5"
    t0 = time.monotonic()
    reg = connect(url)
    assert time.monotonic() - t0 < 1.0  # no dialing in connect itself
    try:
        with pytest.raises(RegistryUnavailable, match="etcd get"):
            reg.sync.get("k")
    finally:
        run(reg.close())


def test_memory_scheme_delegates_and_close_forgets():
    from waypost.registries.memory.store import MemoryRegistry

    a = connect("memory://connect-test")
    assert isinstance(a, MemoryRegistry)
    assert connect("memory://connect-test") is a
    assert connect("memory://other-name") is not a
    run(a.close())
    assert connect("memory://connect-test") is not a


def test_works_against_real_etcd(shared_etcd, unique_key):
    reg = connect(shared_etcd.url())
    assert connect(shared_etcd.url()) is reg
    reg.sync.put(unique_key, "v")
    assert reg.sync.get(unique_key).kvs[0].value == b"v"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_child_after_fork_gets_a_fresh_registry():
    reg = connect("memory://fork-test")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no network, no grpc; just the cache
        try:
            os.write(w, b"same" if connect("memory://fork-test") is reg else b"fresh")
        finally:
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 16)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert answer == b"fresh"
    assert connect("memory://fork-test") is reg


@pytest.mark.parametrize(("url", "problem"), [
    ("", "empty registry URL"),
    ("127.0.0.1:2379", "missing scheme"),
    ("zk://127.0.0.1:2181", "zk:// registries hold service instances, not keys"),
    ("nacos://127.0.0.1:8848", "unknown scheme 'nacos'"),
    ("etcd://", "no host"),
    ("etcd://:2379", "etcd endpoint ':2379': empty host"),
    ("etcd://h1:2379,,h2:2379", "etcd endpoint '': empty host"),
    ("etcd://h:99999", "bad port '99999'"),
    ("etcd://h:abc", "bad port 'abc'"),
    ("etcd://::1:2379", "IPv6"),
    ("etcd://h:2379/some/key", "unexpected path"),
    ("etcd://h:2379?tls=maybe", "tls='maybe'"),
    ("etcd://h:2379?dial_timeout=soon", "dial_timeout='soon'"),
    ("etcd://h:2379?bogus=1", "unknown option 'bogus'"),
    ("etcd://h:2379?ca=/nonexistent/ca.pem", "CA file '/nonexistent/ca.pem' does not exist"),
    ("etcd://h:2379?cert=/nonexistent/c.pem&key=/nonexistent/k.pem", "TLS certificate file"),
    ("etcd://user:hunter2@:2379", "empty host"),
])
def test_bad_urls_raise_invalid_target_naming_the_problem(url, problem):
    with pytest.raises(InvalidTarget) as e:
        connect(url)
    msg = str(e.value)
    assert problem in msg
    assert "example" in msg
    assert "hunter2" not in msg
    assert isinstance(e.value, ValueError)


def test_cert_without_key_and_unreadable_file(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(InvalidTarget, match="cert and key must be given together"):
        connect(f"etcd://h:2379?cert={cert}")
    if os.geteuid() != 0:  # root reads anything
        cert.chmod(0)
        with pytest.raises(InvalidTarget, match="not readable"):
            connect(f"etcd://h:2379?ca={cert}")
