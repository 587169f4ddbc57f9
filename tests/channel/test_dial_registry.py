"""dial(registry, key=...): go-zero's EtcdConf{Hosts, Key} as a registry object and a key, against real etcd;
and one set of TLS option names (cacert/certfile/keyfile) for registry URLs and targets alike."""

from __future__ import annotations

import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from tests.channel.support import echo_servers
from waypost.discovery.registry_url import parse_registry_url
from waypost.resolver.target import parse_target, target_for_registry


def test_dial_a_registry_object_and_a_key(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    with echo_servers("a") as (srv,):
        pub = waypost.Publisher(reg, unique_key, srv.address)
        pub.start()
        try:
            with waypost.dial(reg, key=unique_key) as ch:
                assert ch.target == f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
                reply = echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="x"), timeout=10)
                assert reply.server == "a"
        finally:
            pub.stop()


async def test_aio_dial_a_registry_object_and_a_key(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    with echo_servers("b") as (srv,):
        pub = waypost.Publisher(reg, unique_key, srv.address)
        pub.start()
        try:
            ch = waypost.aio.dial(reg, key=unique_key)
            try:
                reply = await echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="x"), timeout=10)
                assert reply.server == "b"
            finally:
                await ch.close()
        finally:
            pub.stop()


def test_the_target_keeps_user_password_tls_and_timeouts(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    url = f"etcd://alice:s%40cret@10.0.0.1:2379,10.0.0.2:2379?cacert={ca}&dial_timeout=2"
    reg = waypost.connect(url)  # no network: a registry connects on first use
    t = parse_target(target_for_registry(reg, "greet.rpc"))
    assert t.key == "greet.rpc" and t.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")
    assert t.options["user"] == "alice" and t.options["password"] == "s@cret"
    assert t.options["cacert"] == str(ca) and t.options["dial_timeout"] == "2"
    # the same settings: connect() hands back the very registry the channel will read through
    assert waypost.connect(t.registry_url()) is reg
    assert "s@cret" not in t.redacted and "s%40cret" not in t.redacted


def test_memory_registry_and_bad_uses():
    reg = waypost.connect("memory://dialreg")
    assert parse_target(target_for_registry(reg, "greet.rpc")).key == "greet.rpc"
    with pytest.raises(waypost.InvalidTarget, match="key= goes with a registry object"):
        waypost.dial("etcd:///127.0.0.1:2379?key=a.rpc", key="b.rpc")
    with pytest.raises(waypost.InvalidTarget, match="service key"):
        waypost.dial(reg, key="")
    with pytest.raises(waypost.InvalidTarget, match="target must be a string"):
        waypost.dial(reg)  # a registry needs its key
    with pytest.raises(waypost.InvalidTarget, match="expected a target string or a registry"):
        waypost.dial(object(), key="greet.rpc")  # type: ignore[arg-type]


def test_registry_urls_take_the_target_names_of_the_tls_files(tmp_path):
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("x")
    new = parse_registry_url(f"etcd://127.0.0.1:2379?cacert={ca}&certfile={cert}&keyfile={key}")
    old = parse_registry_url(f"etcd://127.0.0.1:2379?ca={ca}&cert={cert}&key={key}")
    assert new.config == old.config and new.config.tls and new.config.key_file == str(key)
    with pytest.raises(waypost.InvalidTarget, match="'ca' and 'cacert' are the same option"):
        parse_registry_url(f"etcd://127.0.0.1:2379?ca={ca}&cacert={ca}")
    with pytest.raises(waypost.InvalidTarget, match="unknown option 'cafile'.*cacert"):
        parse_registry_url(f"etcd://127.0.0.1:2379?cafile={ca}")
