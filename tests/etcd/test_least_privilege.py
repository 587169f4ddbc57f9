"""Least-privilege etcd users (real etcd with auth on, real gRPC backends): what subscribers and publishers
need, and what they do with less (docs/operations.md, "etcd permissions")."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.etcd.helpers import add_user, enable_auth
from waypost.cli.commands import app
from waypost.errors import PermissionDenied

KEY = "greet.rpc"
SIDE = f"_waypost/meta/{KEY}/"
ROOT_PW = "r00t-Secret-pw"
PW = "user-Secret-pw"


@pytest.fixture
def roles(etcd):
    """auth on; ``reader``: read on greet.rpc/ only (what a go-zero deployment grants its clients);
    ``pub``: readwrite on greet.rpc/; ``pubmeta``: that and readwrite on the side prefix; ``writer``:
    write on greet.rpc/ only; ``other``: read on other.rpc/ only."""
    as_root = enable_auth(etcd, ROOT_PW)
    add_user(etcd, as_root, "reader", PW, ("read", f"{KEY}/"))
    add_user(etcd, as_root, "pub", PW, ("readwrite", f"{KEY}/"))
    add_user(etcd, as_root, "pubmeta", PW, ("readwrite", f"{KEY}/"), ("readwrite", SIDE))
    add_user(etcd, as_root, "writer", PW, ("write", f"{KEY}/"))
    add_user(etcd, as_root, "other", PW, ("read", "other.rpc/"))
    return etcd


def _url(etcd, user: str, password: str = PW) -> str:
    return f"etcd://{user}:{password}@{etcd.endpoint}"


def _meta_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "waypost.discovery" and SIDE in r.getMessage()]


def test_read_only_role_on_the_address_prefix_dials_and_calls_with_one_warning(roles, caplog):
    caplog.set_level(logging.WARNING, logger="waypost")
    root = _url(roles, "root", ROOT_PW)
    with echo_servers("a", "b") as servers:
        pubs = [waypost.Publisher(root, KEY, s.address, metadata={"weight": 5}).start() for s in servers]
        try:
            with waypost.Subscriber(_url(roles, "reader"), KEY) as sub:
                assert sorted(sub.values()) == sorted(s.address for s in servers)
                assert all(dict(b.metadata) == {} for b in sub.backends())  # no access: no metadata
                (warning,) = _meta_warnings(caplog)
                assert "read" in warning and f"grant-permission ROLE --prefix=true read {SIDE}" in warning
                # more events (a metadata change, a new backend, a removal): no further warning
                pubs[0].update_metadata({"weight": 9})
                extra = waypost.Publisher(root, KEY, "127.0.0.1:1", metadata={"weight": 1}).start()
                wait_until(lambda: "127.0.0.1:1" in sub.values(), 10)
                extra.stop()
                wait_until(lambda: "127.0.0.1:1" not in sub.values(), 10)
                assert len(_meta_warnings(caplog)) == 1

                target = f"etcd://reader:{PW}@/{roles.endpoint}?key={KEY}"
                with waypost.dial(target, balancer="round_robin") as ch:
                    stub = echo_pb2_grpc.EchoStub(ch)
                    answered = {stub.Unary(echo_pb2.EchoRequest(), timeout=10).server for _ in range(20)}
                assert answered == {"a", "b"}
                assert len(_meta_warnings(caplog)) <= 2  # at most one more, for the dial's own subscription
        finally:
            for p in pubs:
                p.stop()
    assert PW not in caplog.text and ROOT_PW not in caplog.text


def test_resolve_command_works_for_a_read_only_user(roles):
    root = _url(roles, "root", ROOT_PW)
    with waypost.Publisher(root, KEY, "127.0.0.1:9001", metadata={"zone": "a"}):
        target = f"etcd://reader:{PW}@/{roles.endpoint}?key={KEY}"
        res = CliRunner().invoke(app, ["--json", "resolve", target], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert [(b["address"], b["metadata"]) for b in out["backends"]] == [("127.0.0.1:9001", {})]
        # ls of the service lists the addresses and notes the metadata it may not read
        res = CliRunner().invoke(app, ["--registry", _url(roles, "reader"), "--json", "ls", f"{KEY}/"],
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert [i["address"] for i in json.loads(res.stdout)["services"][KEY]] == ["127.0.0.1:9001"]
        assert "without waypost metadata" in res.stderr


def test_no_read_permission_on_the_address_prefix_says_which_to_add(roles):
    with pytest.raises(PermissionDenied) as e:
        waypost.Subscriber(_url(roles, "other"), KEY, timeout=10)
    text = str(e.value)
    assert f"read permission on '{KEY}/'" in text and f"--prefix=true read {KEY}/" in text


def test_publisher_permissions(roles, caplog):
    caplog.set_level(logging.WARNING, logger="waypost")
    with waypost.Subscriber(_url(roles, "root", ROOT_PW), KEY) as sub:
        # readwrite on the address prefix: enough without metadata
        with waypost.Publisher(_url(roles, "pub"), KEY, "127.0.0.1:7001", timeout=5):
            wait_until(lambda: sub.values() == ["127.0.0.1:7001"], 10)
        wait_until(lambda: sub.values() == [], 10, what="the revoke (needs write on the records)")
        # with metadata, a refused side record fails the start, naming the permission
        with pytest.raises(PermissionDenied) as e:
            waypost.Publisher(_url(roles, "pub"), KEY, "127.0.0.1:7002", metadata={"weight": 0}, timeout=5).start()
        assert f"readwrite on '{SIDE}'" in str(e.value) and f"--prefix=true readwrite {SIDE}" in str(e.value)
        assert sub.values() == []  # nothing registered without its metadata
        # granted the side prefix too: metadata works
        with waypost.Publisher(_url(roles, "pubmeta"), KEY, "127.0.0.1:7003", metadata={"weight": 2}, timeout=5):
            wait_until(lambda: [dict(b.metadata) for b in sub.backends()] == [{"weight": 2}], 10)
        wait_until(lambda: sub.values() == [], 10)
        # write-only: registered and renewed, but not guarded (one warning saying so)
        caplog.clear()
        with waypost.Publisher(_url(roles, "writer"), KEY, "127.0.0.1:7004", timeout=5) as pub:
            wait_until(lambda: sub.values() == ["127.0.0.1:7004"], 10)
            wait_until(lambda: any("cannot watch its own record" in r.getMessage() for r in caplog.records), 10)
            assert pub.registered
        wait_until(lambda: sub.values() == [], 10)
        guard = [r for r in caplog.records if "cannot watch its own record" in r.getMessage()]
        assert len(guard) == 1 and f"readwrite {KEY}/" in guard[0].getMessage()
