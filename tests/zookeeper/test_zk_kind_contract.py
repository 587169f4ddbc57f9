"""The kind contract suite (``tests/registry/kind_contract.py``) run for the ZooKeeper kind against a real ZooKeeper
3.9.5 (``tests/zookeeper/support.py``), in Kratos' layout."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.registry.kind_contract import KindContract
from tests.zookeeper import support as zk_support
from waypost.etcd.local import free_port
from waypost.registries.zookeeper.kind import KIND

pytestmark = [pytest.mark.skipif(zk_support.skip_reason() is not None, reason=str(zk_support.skip_reason())),
              zk_support.timeout_mark()]


@pytest.fixture(scope="module")
def zk_server() -> Iterator[zk_support.ZkServer]:
    """One ZooKeeper for the suite (stopped and started again by ``registry_down``: it keeps its port and data)."""
    s = zk_support.ZkServer().start()
    try:
        yield s
    finally:
        s.close()


class TestZkKind(KindContract):
    kind = KIND

    @pytest.fixture(autouse=True)
    def _server(self, zk_server: zk_support.ZkServer) -> None:
        self.server = zk_server

    def registry_url(self) -> str:
        return f"zk://{self.server.hosts}"

    def target(self, service: str) -> str:
        return f"zk://{self.server.hosts}/{service}"

    def unreachable_url(self) -> tuple[str, str]:
        return f"zk://127.0.0.1:{free_port()}", "connection refused"

    def carried(self, metadata: dict[str, Any]) -> dict[str, Any]:
        return {k: str(v) for k, v in metadata.items()}  # Kratos' metadata is map[string]string

    def delete_instance(self, service: str, address: str) -> None:
        from kazoo.client import KazooClient

        plain = KazooClient(hosts=self.server.hosts, timeout=10)
        plain.start(timeout=10)
        try:
            parent = f"/microservices/{service}"
            for child in plain.get_children(parent):
                if f"grpc://{address}" in json.loads(plain.get(f"{parent}/{child}")[0])["endpoints"]:
                    plain.delete(f"{parent}/{child}")
                    return
            raise AssertionError(f"no node of {address} under {parent}")
        finally:
            plain.stop()
            plain.close()

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        self.server.stop()
        try:
            yield
        finally:
            self.server.start()
