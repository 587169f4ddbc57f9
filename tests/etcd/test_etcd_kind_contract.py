"""The kind contract suite (``tests/registry/kind_contract.py``) run for the etcd kind, against a real etcd (stopped
and started again for the outage)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import waypost
from tests.registry.kind_contract import KindContract
from waypost.kind_table import lookup


def delete_records(url: str, service: str, address: str) -> None:
    """Delete ``service``'s go-zero records of ``address`` (``service/ID`` -> ``address``) behind the publisher's
    back, as an operator's ``etcdctl del`` would."""
    from waypost.discovery.store import SyncRegistry

    reg = SyncRegistry(waypost.connect(url))
    found = [kv.key for kv in reg.get(f"{service}/", prefix=True).kvs if kv.value == address.encode()]
    assert found, f"no record of {address} under {service}/"
    for key in found:
        reg.delete(key)


class TestEtcdKind(KindContract):
    kind = lookup("etcd")  # type: ignore[assignment]

    @pytest.fixture(autouse=True)
    def _etcd(self, etcd) -> None:
        self.etcd = etcd

    def registry_url(self) -> str:
        return self.etcd.url()

    def target(self, service: str) -> str:
        return f"etcd:///{self.etcd.endpoint}?key={service}"

    def unreachable_url(self) -> tuple[str, str]:
        return "etcd://127.0.0.1:1?dial_timeout=0.5", "127.0.0.1:1"

    def delete_instance(self, service: str, address: str) -> None:
        delete_records(self.registry_url(), service, address)

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        self.etcd.stop()
        try:
            yield
        finally:
            self.etcd.start()
