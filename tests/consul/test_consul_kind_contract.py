"""The kind contract suite (``tests/registry/kind_contract.py``) run for the Consul kind against a real Consul agent:
servers register with the agent itself; clients read it through a TCP proxy, which ``registry_down`` cuts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from harness import consul_agent
from harness.consul_agent import fixture_consul_bin, fixture_shared_agent  # noqa: F401 (fixtures)
from harness.tcp_proxy import TcpProxy
from tests.registry.kind_contract import KindContract
from waypost.etcd.local import free_port
from waypost.registries.consul.kind import KIND

pytestmark = [consul_agent.timeout_mark()]


class TestConsulKind(KindContract):
    kind = KIND

    @pytest.fixture(autouse=True)
    def _agent(self, shared_agent: consul_agent.ConsulAgent) -> Iterator[None]:
        self.agent = shared_agent
        self.proxy = TcpProxy(("127.0.0.1", shared_agent.http_port))
        try:
            yield
        finally:
            self.proxy.close()

    def registry_url(self) -> str:
        return self.agent.url

    def target(self, service: str) -> str:
        return f"consul://{self.proxy.endpoint}/{service}"

    def unreachable_url(self) -> tuple[str, str]:
        return f"consul://127.0.0.1:{free_port()}", "unreachable"

    def delete_instance(self, service: str, address: str) -> None:
        for entry in self.agent.health(service, passing=False):
            svc = entry["Service"]
            if f"{svc['Address']}:{svc['Port']}" == address:
                self.agent.deregister(svc["ID"])

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        self.proxy.cut()
        try:
            yield
        finally:
            self.proxy.restore()
