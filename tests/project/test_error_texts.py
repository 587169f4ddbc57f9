"""The errors a new user meets first say what is wrong and what to do (real etcd, real gRPC servers)."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest
from click.testing import CliRunner

import waypost
from tests.channel.support import echo_servers
from tests.etcd.helpers import registry
from waypost.cli.commands import app
from waypost.errors import RegistryError, RegistryUnavailable
from waypost.netutil import AddressError
from waypost.server import BindError, serve


def test_a_grpc_server_that_is_not_etcd_says_so():
    with echo_servers("not-etcd") as (server,):
        with registry(server.address) as reg, pytest.raises(RegistryError) as e:
            reg.sync.get("greet.rpc/", prefix=True)
        text = str(e.value)
        assert "not an etcd endpoint (it answered UNIMPLEMENTED to the etcd KV service)" in text
        assert "(key " not in text and "Method not found" not in text
        with pytest.raises(RegistryUnavailable, match="not an etcd endpoint"):
            waypost.Subscriber(f"etcd://{server.address}", "greet.rpc", timeout=1.5)


def test_a_huge_key_is_named_by_its_size_not_echoed(shared_etcd):
    with registry(shared_etcd.endpoint) as reg, pytest.raises(RegistryError) as e:
        reg.sync.put("k" * 2_000_000, b"v")
    text = str(e.value)
    assert "key too large (2000000 bytes" in text
    assert len(text) < 400 and "k" * 101 not in text


def test_ttl_must_be_a_whole_number_of_seconds():
    with pytest.raises(ValueError) as e:
        waypost.Publisher("memory://errors", "greet.rpc", "127.0.0.1:8080", ttl=1.5)  # type: ignore[arg-type]
    assert str(e.value) == "ttl must be a whole number of seconds >= 1, got 1.5"
    with pytest.raises(ValueError, match=r"ttl must be a whole number of seconds >= 1, got 0"):
        waypost.Publisher("memory://errors", "greet.rpc", "127.0.0.1:8080", ttl=0)


@pytest.mark.parametrize(("metadata", "error", "text"), [
    ([1, 2], TypeError, "metadata must be a mapping of str keys to JSON values (e.g. {'weight': 20}), got a list"),
    ("weight=1", TypeError, "metadata must be a mapping"),
    ({"a": object()}, TypeError, "metadata['a'] is of type object, which is not JSON-serialisable"),
    ({"a": {"b": [1, {2}]}}, TypeError, "metadata['a']['b'][1] is of type set, which is not JSON-serialisable"),
    ({"w": float("nan")}, ValueError, "metadata['w'] is nan, which JSON cannot carry"),
    ({1: "x"}, TypeError, "metadata: key 1 is not a string"),
])
def test_bad_metadata_names_the_field(metadata, error, text):
    with pytest.raises(error) as e:
        waypost.Publisher("memory://errors", "greet.rpc", "127.0.0.1:8080", metadata=metadata)
    assert text in str(e.value)


def test_a_port_in_use_says_so_in_the_exception(unique_key):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError) as e:
            serve(grpc.server(futures.ThreadPoolExecutor(2)), unique_key, listen_on=f"127.0.0.1:{port}",
                  registry=f"memory://{unique_key}")
    assert f"cannot listen on '127.0.0.1:{port}': Address already in use" in str(e.value)


@pytest.mark.parametrize(("address", "cli_text"), [
    ("0.0.0.0:80", "unspecified (wildcard) address: clients cannot dial it"),
    ("[::]:8080", "unspecified (wildcard) address: clients cannot dial it"),
    (":8080", "ADDR ':8080': empty host"),  # the CLI's own host:port check
])
def test_an_unspecified_address_is_refused(address, cli_text, shared_etcd):
    with pytest.raises(AddressError, match="unspecified .wildcard. address: clients cannot dial it"):
        waypost.Publisher("memory://errors", "greet.rpc", address)
    res = CliRunner().invoke(app, ["--registry", shared_etcd.url(), "register", "greet.rpc", address])
    assert res.exit_code != 0
    assert cli_text in res.stderr and "Traceback" not in res.output


def test_a_key_ending_in_a_slash_is_refused(shared_etcd):
    with pytest.raises(ValueError) as e:
        waypost.Publisher("memory://errors", "greet.rpc/", "127.0.0.1:8080")
    assert str(e.value).startswith("publisher key 'greet.rpc/' ends with '/': give the service key without it "
                                   "('greet.rpc')")
    res = CliRunner().invoke(app, ["--registry", shared_etcd.url(), "register", "greet.rpc/", "127.0.0.1:8080"])
    assert res.exit_code != 0 and "ends with '/'" in res.stderr
    assert not waypost.connect(shared_etcd.url()).sync.get("greet.rpc/", prefix=True).kvs


def _type_error(call) -> str:
    with pytest.raises(TypeError) as e:
        call()
    return str(e.value)


async def _serve_async_with(**kwargs: object) -> None:
    # the grpc.aio server is made inside the loop: made outside, it asks for the thread's event loop, which an earlier
    # test's asyncio.run may have left unset
    await waypost.aio.serve(grpc.aio.server(), "greet.rpc", registry=None, **kwargs)  # type: ignore[arg-type]


def test_a_misspelt_keyword_names_the_function_called_and_the_keyword_meant():
    import asyncio

    import waypost.aio

    server = grpc.server(futures.ThreadPoolExecutor(1))
    cases = [
        (lambda: waypost.dial("direct:///127.0.0.1:1", balncer="round_robin"),
         "waypost.dial() got an unexpected keyword argument 'balncer'; did you mean 'balancer'?"),
        (lambda: waypost.aio.dial("direct:///127.0.0.1:1", subset_sise=3),
         "waypost.aio.dial() got an unexpected keyword argument 'subset_sise'; did you mean 'subset_size'?"),
        (lambda: waypost.serve(server, "greet.rpc", registry=None, tll=3),
         "waypost.serve() got an unexpected keyword argument 'tll'; did you mean 'ttl'?"),
        # a weight is registration metadata: the keyword it is closest to says so
        (lambda: waypost.serve(server, "greet.rpc", registry=None, wieght=3),
         "waypost.serve() got an unexpected keyword argument 'wieght'; did you mean metadata={'weight': 3}?"),
        (lambda: asyncio.run(_serve_async_with(grase=1.0)),
         "waypost.serve_async() got an unexpected keyword argument 'grase'; did you mean 'grace'?"),
        (lambda: waypost.Publisher("memory://errors", "greet.rpc", "127.0.0.1:8080", metdata={}),
         "waypost.Publisher() got an unexpected keyword argument 'metdata'; did you mean 'metadata'?"),
        (lambda: waypost.Subscriber("memory://errors", "greet.rpc", fomat="kratos"),
         "waypost.Subscriber() got an unexpected keyword argument 'fomat'; did you mean 'format'?"),
        (lambda: waypost.EurekaPublisher("eureka://127.0.0.1:1", "greet", "127.0.0.1:8080", tttl=3),
         "waypost.EurekaPublisher() got an unexpected keyword argument 'tttl'; did you mean 'ttl'?"),
        # nothing close: Python's words, under the public name, and no guess
        (lambda: waypost.dial("direct:///127.0.0.1:1", zzzz=1),
         "waypost.dial() got an unexpected keyword argument 'zzzz'"),
    ]
    for call, text in cases:
        assert _type_error(call) == text
    server.stop(None)
