"""Security end to end through the public API: etcd with TLS (CA + client certificate) and user/password
auth, a read-only role, TLS to the backends, and no secret in any log line, repr, exception or CLI output."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from urllib.parse import quote

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from waypost import _loop
from waypost.etcd.local import LocalEtcd

trustme = pytest.importorskip("trustme")

ROOT = Path(__file__).resolve().parents[2]
Req = echo_pb2.EchoRequest

ROOT_PW = "R00t-pw-9f3Kq"
APP_PW = "App-pw-x7Lm2"
READER_PW = "Reader-pw-Q4zt8"
WRONG_PW = "Wrong-pw-Hj5s1"
KEY = "sec.rpc"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate; PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("waypost-client")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key",
             "client_cert": d / "client.pem", "client_key": d / "client.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    out = {k: str(v) for k, v in files.items()}
    out["ca_pem"] = ca.cert_pem.bytes()
    out["server_key_pem"] = server.private_key_pem.bytes()
    out["server_chain_pem"] = b"".join(c.bytes() for c in server.cert_chain_pems)
    return out


def _key_fragments(pem: bytes) -> list[str]:
    """Lines of a private key's base64 body: none may appear anywhere."""
    return [ln for ln in pem.decode().splitlines() if ln and not ln.startswith("-----")][:3]


@pytest.fixture
def secure_etcd(tmp_path, pki):
    """One etcd member with TLS (client certificates required) and auth on: root; 'app' may read and write
    under KEY (and go-zero's side records); 'reader' may only read."""
    tls = {"ca": pki["ca"], "cert": pki["cert"], "key": pki["key"], "client_cert": pki["client_cert"],
           "client_key": pki["client_key"], "client_cert_auth": "1"}
    node = LocalEtcd(1, base_dir=tmp_path / "etcd", tls=tls).start()
    try:
        ctl = node.etcdctl
        ctl("user", "add", "root", f"--new-user-password={ROOT_PW}")
        ctl("auth", "enable")
        root = f"--user=root:{ROOT_PW}"
        for user, pw, perm in (("app", APP_PW, "readwrite"), ("reader", READER_PW, "read")):
            ctl(root, "user", "add", user, f"--new-user-password={pw}")
            ctl(root, "role", "add", user)
            ctl(root, "role", "grant-permission", user, "--prefix=true", perm, KEY)
            ctl(root, "role", "grant-permission", user, "--prefix=true", perm, "_waypost/")
            ctl(root, "user", "grant-role", user, user)
        yield node
    finally:
        node.close()


def registry_url(node: LocalEtcd, pki, user: str, pw: str) -> str:
    q = f"?tls=1&ca={quote(pki['ca'])}&cert={quote(pki['client_cert'])}&key={quote(pki['client_key'])}"
    return f"etcd://{user}:{quote(pw, safe='')}@{node.endpoint}{q}"


def dial_target(node: LocalEtcd, pki, user: str, pw: str) -> str:
    return (f"etcd:///{node.endpoint}?key={KEY}&user={user}&password={quote(pw, safe='')}&tls=1"
            f"&cacert={quote(pki['ca'])}&certfile={quote(pki['client_cert'])}&keyfile={quote(pki['client_key'])}")


class TlsEcho:
    """An in-process Echo server with a TLS port (the trustme server certificate)."""

    def __init__(self, name: str, pki) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
        echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), self.server)
        creds = grpc.ssl_server_credentials([(pki["server_key_pem"], pki["server_chain_pem"])])
        self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(10)


def close_registry(reg) -> None:
    _loop.run(reg.close(), 10)


def test_tls_and_auth_end_to_end_and_tokens_refreshed_after_restart(secure_etcd, pki):
    reg = waypost.connect(registry_url(secure_etcd, pki, "app", APP_PW))
    backends = [TlsEcho("one", pki), TlsEcho("two", pki)]
    pubs = [waypost.Publisher(reg, KEY, backends[0].address, ttl=5).start()]
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
    ch = waypost.dial(dial_target(secure_etcd, pki, "app", APP_PW), balancer="round_robin", credentials=creds)
    try:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req(message="hi"), timeout=20, wait_for_ready=True).server == "one"
        token = reg.client.auth.current
        secure_etcd.members[0].restart()  # every auth token dies with the process
        # the publisher keeps its registration, re-authenticating on its own; a new one registers too
        pubs.append(waypost.Publisher(reg, KEY, backends[1].address, ttl=5).start())
        assert reg.client.auth.current and reg.client.auth.current != token
        # the channel's watch (its own authenticated connection) resumed: the new backend gets calls
        wait_until(lambda: "two" in {stub.Unary(Req(), timeout=10).server for _ in range(4)}, 30,
                   what="backend registered after the restart reached through the resumed watch")
        assert {kv.value for kv in reg.sync.get(KEY + "/", prefix=True).kvs} == {
            b.address.encode() for b in backends}
    finally:
        ch.close()
        for p in pubs:
            p.stop()
        for b in backends:
            b.stop()
        close_registry(reg)


def test_read_only_role_subscribes_but_cannot_publish(secure_etcd, pki):
    writer = waypost.connect(registry_url(secure_etcd, pki, "app", APP_PW))
    reader = waypost.connect(registry_url(secure_etcd, pki, "reader", READER_PW))
    pub = waypost.Publisher(writer, KEY, "127.0.0.1:7301", ttl=5).start()
    sub = waypost.Subscriber(reader, KEY)
    try:
        assert sub.values() == ["127.0.0.1:7301"]
        later = waypost.Publisher(writer, KEY, "127.0.0.1:7302", ttl=5).start()
        assert wait_until(lambda: sorted(sub.values()) == ["127.0.0.1:7301", "127.0.0.1:7302"], 20)
        later.stop()
        with pytest.raises(waypost.PermissionDenied) as e:
            waypost.Publisher(reader, KEY, "127.0.0.1:7303", ttl=5).start()
        assert KEY in str(e.value), str(e.value)
        assert READER_PW not in str(e.value) and READER_PW not in repr(e.value)
        # the refused publisher left nothing behind, and the reader's subscription still works
        assert wait_until(lambda: sub.values() == ["127.0.0.1:7301"], 20)
    finally:
        sub.close()
        pub.stop()
        close_registry(writer)
        close_registry(reader)


def test_tls_backends_through_dial_credentials(pki):
    servers = [TlsEcho("t1", pki), TlsEcho("t2", pki)]
    target = "direct:///" + ",".join(s.address for s in servers)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
        with waypost.dial(target, balancer="round_robin", credentials=creds) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            stub.Unary(Req(), timeout=20, wait_for_ready=True)
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20)
            assert {stub.Unary(Req(), timeout=10).server for _ in range(4)} == {"t1", "t2"}
        # without credentials a TLS backend is never READY: calls fail, none is silently sent in clear
        with waypost.dial(target, balancer="round_robin") as plain:
            with pytest.raises(grpc.RpcError) as e:
                echo_pb2_grpc.EchoStub(plain).Unary(Req(), timeout=2)
            assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        for s in servers:
            s.stop()


def _cli(*args: str, registry: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "waypost.cli", "--registry", registry, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def _secrets(pki, tokens: list[str]) -> list[str]:
    return [ROOT_PW, APP_PW, READER_PW, WRONG_PW, quote(APP_PW, safe=""), *[t for t in tokens if t],
            *_key_fragments(Path(pki["client_key"]).read_bytes()), *_key_fragments(pki["server_key_pem"])]


def _assert_no_leak(seen: list[str], secrets: list[str], caplog, capsys) -> str:
    captured = capsys.readouterr()
    seen = [*seen, caplog.text, captured.out, captured.err]
    seen += [r.getMessage() + str(r.args) + str(r.exc_text or "") for r in caplog.records]
    everything = "\n".join(seen)
    leaks = [s[:6] + "..." for s in secrets if s in everything]
    where = [ln[:300] for ln in everything.splitlines() if any(s in ln for s in secrets)][:5]
    assert leaks == [], f"secrets leaked: {leaks} in lines like {where}"
    return everything


def test_no_secret_in_logs_reprs_errors_or_cli_output(secure_etcd, pki, caplog, capsys):
    """Registry, Publisher, Subscriber, target errors and the CLI, with auth + TLS + a wrong password, at
    DEBUG: every log line (all loggers), repr, exception text and CLI output is scanned."""
    caplog.set_level(logging.DEBUG)  # everything, not only waypost's loggers
    seen: list[str] = []
    reg = waypost.connect(registry_url(secure_etcd, pki, "app", APP_PW))
    pub = waypost.Publisher(reg, KEY, "127.0.0.1:7401", ttl=5).start()
    sub = waypost.Subscriber(reg, KEY)
    tokens = [reg.client.auth.current]
    try:
        seen += [repr(reg), str(reg), str(reg.url), repr(pub), str(pub), repr(sub), str(sub)]
        # etcd restarts: a new token is fetched (and logged about, without the token)
        secure_etcd.members[0].restart()
        reg.sync.put(KEY + "-probe", b"x")
        tokens.append(reg.client.auth.current)
        assert wait_until(lambda: pub.registered, 20)
        # a wrong password
        bad = waypost.connect(registry_url(secure_etcd, pki, "app", WRONG_PW))
        try:
            with pytest.raises(waypost.PermissionDenied) as e:
                bad.sync.get(KEY)
            seen += [str(e.value), repr(e.value), repr(bad)]
            with pytest.raises(waypost.PermissionDenied) as e:
                waypost.Subscriber(bad, KEY)
            seen += [str(e.value), repr(e.value)]
        finally:
            close_registry(bad)
        # a read-only user trying to publish
        reader = waypost.connect(registry_url(secure_etcd, pki, "reader", READER_PW))
        try:
            with pytest.raises(waypost.PermissionDenied) as e:
                waypost.Publisher(reader, KEY, "127.0.0.1:7402", ttl=5).start()
            seen += [str(e.value), repr(e.value), repr(reader)]
        finally:
            close_registry(reader)
        # targets with a password that are wrong
        for t in (f"etcd:///{secure_etcd.endpoint}?key={KEY}&password={APP_PW}&bogus=1",
                  f"etcd://app:{APP_PW}@{secure_etcd.endpoint}/{KEY}?nope=2",
                  f"etcd:///{secure_etcd.endpoint}?key={KEY}&user=app&password={APP_PW}&tls=maybe"):
            with pytest.raises(waypost.InvalidTarget) as e:
                waypost.dial(t)
            seen += [str(e.value), repr(e.value)]
            with pytest.raises(waypost.InvalidTarget) as e:
                waypost.parse_target(t)
            seen += [str(e.value)]
    finally:
        sub.close()
        pub.stop()
        close_registry(reg)
    # the CLI at -vv: a good password, a wrong one, and an unreachable endpoint with a password
    for url in (registry_url(secure_etcd, pki, "app", APP_PW), registry_url(secure_etcd, pki, "app", WRONG_PW),
                f"etcd://app:{APP_PW}@127.0.0.1:1?dial_timeout=1"):
        res = _cli("-vv", "ls", KEY, registry=url)
        seen += [res.stdout, res.stderr]
        if APP_PW in url and "127.0.0.1:1?" not in url:
            assert res.returncode == 0 and KEY in res.stdout, res.stderr
        else:
            assert res.returncode != 0 and res.stderr.strip(), res.stdout
    everything = _assert_no_leak(seen, _secrets(pki, tokens), caplog, capsys)
    assert "permission denied" in everything.lower()  # the failing paths really ran


def test_no_secret_from_a_channel_with_credentials_in_its_target(secure_etcd, pki, caplog, capsys):
    """dial() with user/password and TLS files in the target, a TLS backend that goes away: the channel's
    repr, its log lines and the errors of calls that cannot be served carry no secret."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    reg = waypost.connect(registry_url(secure_etcd, pki, "app", APP_PW))
    backend = TlsEcho("s1", pki)
    pub = waypost.Publisher(reg, KEY, backend.address, ttl=5).start()
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
    ch = waypost.dial(dial_target(secure_etcd, pki, "app", APP_PW), balancer="round_robin", credentials=creds)
    try:
        stub = echo_pb2_grpc.EchoStub(ch)
        stub.Unary(Req(), timeout=20, wait_for_ready=True)
        seen += [repr(ch), str(ch), repr(ch.balancer), ch.balancer.describe()]
        backend.stop()
        wait_until(lambda: not ch.balancer.ready_addresses(), 20)
        with pytest.raises(grpc.RpcError) as e:
            stub.Unary(Req(), timeout=2)
        seen += [str(e.value), repr(e.value), str(e.value.details())]
        with pytest.raises(grpc.RpcError) as e:
            stub.Unary(Req(), timeout=0.5, wait_for_ready=True)
        seen += [str(e.value), repr(e.value), str(e.value.details())]
    finally:
        ch.close()
        pub.stop()
        close_registry(reg)
    seen += [repr(ch)]
    _assert_no_leak(seen, _secrets(pki, []), caplog, capsys)
