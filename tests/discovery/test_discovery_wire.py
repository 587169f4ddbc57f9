"""What a Publisher writes, read back byte for byte with a raw range read, for each wire format."""

from __future__ import annotations

from waypost import Publisher
from waypost.discovery import Subscriber


def _raw(registry, prefix):
    return {kv.key: (kv.value, kv.lease) for kv in registry.sync.get(prefix, prefix=True).kvs}


def test_gozero_bytes(registry):
    with Publisher(registry, "greet.rpc", "127.0.0.1:8080", ttl=5) as pub:
        lease = pub.lease_id
        assert _raw(registry, "greet.rpc/") == {f"greet.rpc/{lease}": (b"127.0.0.1:8080", lease)}
        assert _raw(registry, "_waypost/") == {}  # no metadata: no side record


def test_gozero_metadata_lives_outside_the_go_prefix(registry):
    with Publisher(registry, "greet.rpc", "127.0.0.1:8080", ttl=5, id=7, metadata={"weight": 20}) as pub:
        lease = pub.lease_id
        # a go-zero subscriber reads only greet.rpc/ and sees a plain address
        assert _raw(registry, "greet.rpc/") == {"greet.rpc/7": (b"127.0.0.1:8080", lease)}
        assert _raw(registry, "_waypost/meta/") == {
            "_waypost/meta/greet.rpc/7": (b'{"addr":"127.0.0.1:8080","metadata":{"weight":20}}', lease),
        }
    assert _raw(registry, "_waypost/meta/") == {}  # revoked with the lease


def test_etcd_naming_bytes(registry):
    with Publisher(registry, "greet", "1.2.3.4:50051", ttl=5, format="etcd-naming") as pub:
        assert pub.key == "greet/1.2.3.4:50051"
        assert _raw(registry, "greet/") == {
            "greet/1.2.3.4:50051": (b'{"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}', pub.lease_id),
        }


def test_kratos_bytes(registry):
    with Publisher(registry, "helloworld", "127.0.0.1:9000", ttl=5, id="host-1", format="kratos",
                   metadata={"version": "v1"}) as pub:
        assert pub.key == "/microservices/helloworld/host-1"
        assert _raw(registry, "/microservices/helloworld/") == {
            "/microservices/helloworld/host-1": (
                (b'{"id":"host-1","name":"helloworld","version":"v1","metadata":null,'
                b'"endpoints":["grpc://127.0.0.1:9000"]}'), pub.lease_id),
        }


def test_records_written_by_go_services_are_read(registry):
    """Values as go-zero, grpc-go's endpoints.Manager and Kratos write them (literal bytes)."""
    s = registry.sync
    s.put("gz.rpc/7587844881234567890", b"10.1.0.1:8080")
    s.put("en/10.1.0.2:50051", b'{"Op":0,"Addr":"10.1.0.2:50051","Metadata":{"weight":3}}')
    s.put("/microservices/kr/abc", b'{"id":"abc","name":"kr","version":"","metadata":{"weight":"5"},'
                                   b'"endpoints":["http://10.1.0.3:8000?isSecure=false",'
                                   b'"grpc://10.1.0.3:9000?isSecure=false"]}')
    with Subscriber(registry, "gz.rpc") as a, Subscriber(registry, "en", format="etcd-naming") as b, \
            Subscriber(registry, "kr", format="kratos") as c:
        assert a.values() == ["10.1.0.1:8080"]
        assert [(x.address, dict(x.metadata)) for x in b.backends()] == [("10.1.0.2:50051", {"weight": 3})]
        assert [(x.address, dict(x.metadata)) for x in c.backends()] == [("10.1.0.3:9000", {"weight": "5"})]
