"""The kind contract suite (``tests/registry/kind_contract.py``), its read-only part, run for the DNS kind against a
real dnsmasq: Echo servers on 127.0.0.1-3 (one port), listed by A records."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import waypost.registries.dns.discovery as wdns
from harness.backends.server import EchoServer
from tests.dns.support import Dnsmasq, dnsmasq  # noqa: F401  (fixture)
from tests.registry.kind_contract import KindContract
from waypost.registries.dns.kind import KIND

pytest.importorskip("dns.resolver")

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
NAME = "svc.test"


class TestDnsKind(KindContract):
    kind = KIND
    READ_ONLY = True

    @pytest.fixture(autouse=True)
    def _dns(self, dnsmasq: Dnsmasq) -> None:  # noqa: F811
        self.dns = dnsmasq
        self.port = 0

    def target(self, service: str) -> str:
        return self.dns.target(NAME, self.port)

    def dial_options(self) -> list[tuple[str, Any]]:
        return [(wdns.INTERVAL_OPTION, 300), (wdns.MIN_INTERVAL_OPTION, 100), (wdns.TIMEOUT_OPTION, 300)]

    @contextlib.contextmanager
    def instances_up(self, names: Sequence[str]) -> Iterator[dict[str, str]]:
        for _ in range(5):  # one port on every host: another run may hold it on one of them
            servers: list[EchoServer] = []
            try:
                for name, host in zip(names, HOSTS, strict=False):
                    servers.append(EchoServer(name, port=servers[0].port if servers else 0, bind_host=host).start())
            except RuntimeError:
                for s in servers:
                    s.stop(0)
                continue
            break
        else:
            pytest.skip("cannot bind one port on 127.0.0.1-3")
        self.port = servers[0].port
        self.dns.set({NAME: [s.host for s in servers]})
        try:
            yield {s.name: s.address for s in servers}
        finally:
            for s in servers:
                s.stop(0)

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        self.dns.stop()
        try:
            yield
        finally:
            self.dns.start()

