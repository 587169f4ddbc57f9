"""etcd auth (tokens that die with a restart) and TLS with a client certificate, on real etcd."""

from __future__ import annotations

import logging
import threading

import pytest

from harness.waiting import wait_until
from tests.etcd.helpers import add_user, collect_events, enable_auth, on_loop, registry, run
from waypost.discovery.connections import connect
from waypost.errors import PermissionDenied, RegistryUnavailable
from waypost.etcd.local import LocalEtcd

ROOT_PW = "r00t-Secret-pw"
APP_PW = "app-Secret-pw"


@pytest.fixture
def auth_etcd(etcd):
    """A single etcd with auth on: root, and user 'app' limited to the prefix app/."""
    add_user(etcd, enable_auth(etcd, ROOT_PW), "app", APP_PW, ("readwrite", "app/"))
    return etcd


def _secrets_absent(text: str, *secrets: str) -> None:
    for s in secrets:
        assert s and s not in text


def test_auth_survives_restart_without_user_action(auth_etcd, caplog):
    caplog.set_level(logging.DEBUG, logger="waypost")
    with registry(auth_etcd.endpoint, username="root", password=ROOT_PW) as reg:
        s = reg.sync
        s.put("svc/a", b"1")
        token1 = reg.client.auth.current
        assert token1
        lease = s.grant(6)
        lost: list[object] = []
        ka = on_loop(lambda: reg.keep_alive(lease, 6, lambda *a: lost.append(a)))
        w = reg.watch("svc/", prefix=True)
        try:
            assert wait_until(lambda: w.connected, 15)
            auth_etcd.members[0].restart()  # invalidates every token
            s.put("svc/b", b"2")
            assert s.get("svc/b").kvs[0].value == b"2"
            token2 = reg.client.auth.current
            assert token2 and token2 != token1
            assert [e.kv.key for e in collect_events(w, 1, timeout=20)] == ["svc/b"]
            mgr = reg.client.leases
            assert wait_until(lambda: mgr.connects >= 2 and mgr._leases[lease].renewed >= 2, 20)
            assert lost == [] and s.time_to_live(lease) > 0
            text = "\n".join([caplog.text, repr(reg), str(reg.url), repr(reg.config), repr(reg.client),
                              repr(reg.client.cfg)])
            _secrets_absent(text, ROOT_PW, token1, token2)
        finally:
            ka.cancel()
            w.cancel()


def test_wrong_password_is_permission_denied_without_echoing_it(auth_etcd, caplog):
    caplog.set_level(logging.DEBUG, logger="waypost")
    with registry(auth_etcd.endpoint, username="root", password="not-the-Password") as reg:
        with pytest.raises(PermissionDenied) as e:
            reg.sync.get("k")
        assert "root" in str(e.value)
        _secrets_absent(str(e.value) + caplog.text + repr(reg), "not-the-Password")


def test_no_credentials_on_auth_etcd_is_permission_denied(auth_etcd):
    with registry(auth_etcd.endpoint) as reg, pytest.raises(PermissionDenied) as e:
        reg.sync.get("k")
    assert "etcd requires authentication: add user:pass@ to the registry URL" in str(e.value)
    assert "user name is empty" not in str(e.value) and "(key '" not in str(e.value)


def test_permission_denied_for_keys_outside_the_role(auth_etcd, caplog):
    caplog.set_level(logging.DEBUG, logger="waypost")
    with registry(auth_etcd.endpoint, username="app", password=APP_PW) as reg:
        reg.sync.put("app/x", b"1")
        with pytest.raises(PermissionDenied, match="put"):
            reg.sync.put("other/x", b"1")
        ok = reg.watch("app/", prefix=True)
        denied = reg.watch("other/", prefix=True)
        try:
            with pytest.raises(PermissionDenied):
                collect_events(denied, 1, timeout=20)
            # the refused watch does not take the allowed one down
            reg.sync.put("app/y", b"2")
            assert [e.kv.key for e in collect_events(ok, 1, timeout=20)] == ["app/y"]
        finally:
            ok.cancel()
            denied.cancel()
        _secrets_absent(caplog.text, APP_PW)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    trustme = pytest.importorskip("trustme")
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("waypost-client")
    files = {
        "ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key",
        "client_cert": d / "client.pem", "client_key": d / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    return {k: str(v) for k, v in files.items()}


@pytest.fixture
def tls_etcd(tmp_path, tls_files):
    node = LocalEtcd(1, base_dir=tmp_path / "etcd", tls=dict(tls_files, client_cert_auth="1")).start()
    try:
        yield node
    finally:
        node.close()


def test_tls_with_ca_and_client_certificate(tls_etcd, tls_files):
    ep = tls_etcd.endpoint
    with registry(ep, tls=True, ca_file=tls_files["ca"], cert_file=tls_files["client_cert"],
                  key_file=tls_files["client_key"]) as reg:
        reg.sync.put("tls/k", b"v")
        w = reg.watch("tls/", prefix=True)
        try:
            assert wait_until(lambda: w.connected, 15)
            tls_etcd.etcdctl("put", "tls/k2", "v2")
            assert [e.kv.key for e in collect_events(w, 1)] == ["tls/k2"]
        finally:
            w.cancel()
    # the same through a URL, with a hostname endpoint
    port = tls_etcd.members[0].client_port
    url = (f"etcd://localhost:{port}?tls=1&ca={tls_files['ca']}&cert={tls_files['client_cert']}"
           f"&key={tls_files['client_key']}")
    reg = connect(url)
    try:
        assert reg.sync.get("tls/k").kvs[0].value == b"v"
    finally:
        run(reg.close())


def test_tls_without_client_certificate_is_refused(tls_etcd, tls_files):
    with registry(tls_etcd.endpoint, tls=True, ca_file=tls_files["ca"], dial_timeout=1.0) as reg, \
            pytest.raises(RegistryUnavailable):
        reg.sync.get("tls/k")


def test_concurrent_calls_share_one_authentication(auth_etcd):
    with registry(auth_etcd.endpoint, username="root", password=ROOT_PW) as reg:
        errors: list[Exception] = []

        def worker(i: int) -> None:
            try:
                reg.sync.put(f"cc/{i}", b"x")
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert reg.sync.get("cc/", prefix=True, count_only=True).count == 8


def test_refused_credentials_fail_watches_and_leases_loudly(auth_etcd):
    with registry(auth_etcd.endpoint, username="root", password=ROOT_PW) as good:
        lease = good.sync.grant(30)
    with registry(auth_etcd.endpoint, username="root", password="wrong-Password") as reg:
        w = reg.watch("svc/", prefix=True)
        lost: list[tuple[int, BaseException | None]] = []
        reg.keep_alive(lease, 30, lambda i, r: lost.append((i, r)))
        with pytest.raises(PermissionDenied):
            collect_events(w, 1, timeout=20)
        assert wait_until(lambda: lost != [], 20)
        assert lost[0][0] == lease and isinstance(lost[0][1], PermissionDenied)
        assert "wrong-Password" not in str(lost[0][1])
