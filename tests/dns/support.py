"""A real DNS server for tests: dnsmasq on a free 127.0.0.1 port, records from a hosts file we rewrite.

Only our own dnsmasq process is touched (SIGHUP to reload, SIGTERM to stop, by its pid). Names under
``.test`` that are not in the file get NXDOMAIN (``--local=/test/``); nothing is forwarded anywhere.
Tests needing it skip with a message when dnsmasq is not installed (``apt-get install dnsmasq-base``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from waypost.etcd.local import free_port

DNSMASQ = shutil.which("dnsmasq") or next(
    (p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if Path(p).exists()), None)
READY_NAME = "ready.waypost.test"


def _free_dns_port() -> int:
    """A loopback port free for UDP as well as TCP (dnsmasq binds both)."""
    for _ in range(50):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            try:
                u.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port for dnsmasq")


class Dnsmasq:
    """dnsmasq serving ``records`` (name -> IPs, A and AAAA) with TTL ``ttl`` seconds."""

    def __init__(self, workdir: Path, ttl: int = 1) -> None:
        if DNSMASQ is None:
            pytest.skip("dnsmasq is not installed (apt-get install dnsmasq-base); DNS server tests skipped")
        self.dir = workdir
        self.ttl = ttl
        self.hosts = workdir / "hosts"
        self.log = workdir / "dnsmasq.log"
        self.records: dict[str, list[str]] = {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._write()

    @property
    def authority(self) -> str:
        """``127.0.0.1:PORT``, the authority of a ``dns://`` target."""
        return f"127.0.0.1:{self.port}"

    def target(self, name: str, port: int) -> str:
        return f"dns://{self.authority}/{name}:{port}"

    def _write(self) -> None:
        lines = [f"127.0.0.1 {READY_NAME}"]
        for name, ips in self.records.items():
            lines += [f"{ip} {name}" for ip in ips]
        tmp = self.hosts.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.hosts)  # atomic: dnsmasq never reads half a file

    def start(self, timeout: float = 20.0) -> Dnsmasq:
        """Start (or restart on the same port) and wait until it answers."""
        assert self.proc is None, "already running"
        keep_port = self.port
        for _attempt in range(5):
            self.port = keep_port or _free_dns_port()
            cmd = [DNSMASQ, "--keep-in-foreground", "--conf-file=/dev/null", f"--port={self.port}",
                   "--no-resolv", "--no-hosts", f"--addn-hosts={self.hosts}", "--bind-interfaces",
                   "--listen-address=127.0.0.1", "--local=/test/", f"--local-ttl={self.ttl}",
                   "--no-negcache", "--pid-file=", f"--log-facility={self.log}"]
            try:
                import pwd

                cmd.append(f"--user={pwd.getpwuid(os.getuid()).pw_name}")  # no privilege drop to nobody
            except (ImportError, KeyError):
                pass
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
            if self._wait_ready(timeout):
                return self
            err = self._reap()
            if keep_port or "in use" not in err:
                raise RuntimeError(f"dnsmasq did not start on port {self.port}: {err.strip()[-500:]}")
        raise RuntimeError("dnsmasq: no free port after 5 attempts")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            if self.query(READY_NAME, lifetime=0.2) == ["127.0.0.1"]:
                return True
            time.sleep(0.05)
        return False

    def _reap(self) -> str:
        proc, self.proc = self.proc, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate(timeout=10)
        return (err or b"").decode(errors="replace")

    def stop(self) -> None:
        """Stop the server (its port stays reserved in ``self.port`` for ``start()``)."""
        self._reap()

    def query(self, name: str, rdtype: str = "A", lifetime: float = 1.0) -> list[str] | None:
        """What the server answers right now (sorted IPs), None on no answer / error."""
        import dns.exception
        import dns.resolver

        r = dns.resolver.Resolver(configure=False)
        r.nameservers = ["127.0.0.1"]
        r.port = self.port
        r.cache = None
        try:
            ans = r.resolve(name, rdtype, lifetime=lifetime, search=False)
        except dns.exception.DNSException:
            return None
        return sorted(a.to_text() for a in ans)

    def set(self, records: Mapping[str, Sequence[str]], timeout: float = 20.0) -> None:
        """Replace the records (name -> IPs), reload with SIGHUP and wait until the server serves them."""
        self.records = {name: list(ips) for name, ips in records.items()}
        self._write()
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        for name, ips in self.records.items():
            want = sorted(ip for ip in ips if ":" not in ip) or None
            while self.query(name) != want:
                if time.monotonic() > deadline:
                    raise AssertionError(f"dnsmasq did not serve {name} -> {want} within {timeout} s")
                time.sleep(0.05)


def dnsmasq_server(tmp_path: Path, ttl: int = 1) -> Iterator[Dnsmasq]:
    """Started dnsmasq, stopped afterwards (the body of the ``dnsmasq`` fixtures)."""
    pytest.importorskip("dns.resolver", reason="dnspython (the 'dns' extra) is not installed")
    d = Dnsmasq(tmp_path, ttl=ttl).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[Dnsmasq]:
    """A fresh dnsmasq on a free loopback port, TTL 1 s. Change records with ``dnsmasq.set({...})``."""
    yield from dnsmasq_server(tmp_path)
