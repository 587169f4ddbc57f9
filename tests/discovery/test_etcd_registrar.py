"""The etcd kind's registrar under the generic registration (memory and a real etcd): what serve() gets for a keyed
registry, who names the instance, an update racing a lease revoked from outside, and the keyed-only options."""

from __future__ import annotations

import pytest

import waypost
from harness.waiting import wait_until
from waypost.kind_table import lookup
from waypost.kinds.registration import KindRegistration
from waypost.registration.factory import make_publisher
from waypost.registries.etcd.registrar import EtcdRegistrar

ADDR = "127.0.0.1:7301"


def _records(registry: waypost.Registry, key: str) -> dict[str, tuple[bytes, int]]:
    return {kv.key: (kv.value, kv.lease) for kv in registry.sync.get(key + "/", prefix=True).kvs}


@pytest.mark.parametrize("given", ["object", "url"])
def test_serve_registers_in_a_keyed_registry_through_its_registrar(registry, registry_url, unique_key, given):
    pub = make_publisher(registry if given == "object" else registry_url, unique_key, ADDR, ttl=5, format="gozero")
    assert isinstance(pub, KindRegistration) and isinstance(pub.client, EtcdRegistrar)
    assert pub.client.registry is registry  # the shared connection, not one of its own
    with pub:
        assert pub.lease_id > 0 and pub.key == f"{unique_key}/{pub.lease_id}"  # go-zero: the lease names it
        assert _records(registry, unique_key) == {pub.key: (ADDR.encode(), pub.lease_id)}
        assert pub.format.name == "gozero"
    assert (pub.key, pub.lease_id) == (None, 0)
    wait_until(lambda: _records(registry, unique_key) == {}, 10, what="revoked at stop")


def test_a_given_id_names_the_record_across_leases(registry, unique_key):
    with waypost.Publisher(registry, unique_key, ADDR, ttl=5, id=7) as pub:
        first = pub.lease_id
        assert pub.key == f"{unique_key}/7"
        registry.sync.revoke(first)  # lost: registered again under a new lease, the same key
        wait_until(lambda: pub.registered and pub.lease_id not in (0, first), 10, what="registered again")
        assert pub.key == f"{unique_key}/7"
        assert _records(registry, unique_key) == {f"{unique_key}/7": (ADDR.encode(), pub.lease_id)}


def test_an_update_racing_a_revoked_lease_ends_registered_with_the_new_metadata(registry, unique_key):
    with waypost.Publisher(registry, unique_key, ADDR, ttl=5, metadata={"weight": 1}, format="etcd-naming") as pub:
        first = pub.lease_id
        registry.sync.revoke(first)
        try:
            pub.update_metadata({"weight": 3})  # in place, or (the lease gone) written by a new registration
        except waypost.RegistryUnavailable:
            pass  # the update found the lease gone: the registration that follows carries the new metadata
        wait_until(lambda: pub.registered and pub.lease_id not in (0, first), 10, what="registered again")
        wait_until(lambda: [lease for _, lease in _records(registry, unique_key).values()] == [pub.lease_id], 10,
                   what="one record, under the new lease")
        (value, _), = _records(registry, unique_key).values()
        assert b'"weight":3' in value.replace(b" ", b""), value


def test_exclusive_is_an_option_of_the_keyed_registries_only():
    consul = lookup("consul")
    assert consul is not None
    with pytest.raises(ValueError, match="exclusive=True is an option of the keyed registries"):
        KindRegistration(consul, "consul://127.0.0.1:8500", "greet", ADDR, exclusive=True)


def test_exclusive_takes_over_the_records_of_the_same_address(registry, unique_key):
    stale = registry.sync.grant(30)
    registry.sync.put(f"{unique_key}/1", ADDR, lease=stale)  # a previous incarnation's record
    registry.sync.put(f"{unique_key}/2", "127.0.0.1:7302", lease=stale)  # someone else's
    with waypost.Publisher(registry, unique_key, ADDR, ttl=5, exclusive=True) as pub:
        assert sorted(_records(registry, unique_key)) == sorted([pub.key, f"{unique_key}/2"])
