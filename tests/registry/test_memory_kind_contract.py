"""The kind contract suite (``kind_contract.py``) run for the memory kind: the in-process registry with etcd's
semantics. It is never unreachable: the two outage tests do not apply."""

from __future__ import annotations

import itertools

import pytest

from waypost.kind_table import lookup

from .kind_contract import KindContract

_names = itertools.count()


class TestMemoryKind(KindContract):
    kind = lookup("memory")  # type: ignore[assignment]

    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.name = f"kind-contract-{next(_names)}"

    def registry_url(self) -> str:
        return f"memory://{self.name}"

    def target(self, service: str) -> str:
        return f"memory://{self.name}/?key={service}"

    def delete_instance(self, service: str, address: str) -> None:
        from waypost import connect
        from waypost.discovery.store import SyncRegistry

        reg = SyncRegistry(connect(self.registry_url()))
        found = [kv.key for kv in reg.get(f"{service}/", prefix=True).kvs if kv.value == address.encode()]
        assert found, f"no record of {address} under {service}/"
        for key in found:
            reg.delete(key)

    def test_an_unreachable_registry_at_start_names_the_cause(self) -> None:
        pytest.skip("an in-process store is never unreachable")

    def test_dial_keeps_the_last_list_through_an_outage(self) -> None:
        pytest.skip("an in-process store is never down")
