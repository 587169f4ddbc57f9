"""TLS and mTLS on waypost's xDS control plane (``src/waypost/xds/tls.py``): ``waypost xds serve --tls-cert/--tls-key
[--client-ca]`` and the config file's ``[tls]``, certificates re-read without a restart, clear errors for bad files,
and ``waypost xds bootstrap --tls`` (gRFC A65 ``tls`` channel credentials) used by stock grpcio, grpc-go and
grpc-java clients reaching Echo backends registered in a real etcd."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")
trustme = pytest.importorskip("trustme")

from harness.waiting import wait_until
from tests.xds.peer_procs import fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.test_xds_support import ROOT, Backends, XdsServe, _env, picks_all, stock_client
from waypost.xds.exports import parse_config
from waypost.xds.tls import ServerTls, TlsFileError, TlsFiles

ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"


class Pki:
    """A server CA with a server certificate and a client certificate, and another CA's client certificate,
    as PEM files in ``d``."""

    def __init__(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        self.ca, other = trustme.CA(), trustme.CA()
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.cert, self.key = self.issue(self.ca, "server", "localhost", "127.0.0.1")
        self.client_cert, self.client_key = self.issue(self.ca, "client", "waypost-client")
        self.other_cert, self.other_key = self.issue(other, "other", "waypost-client")

    def _write(self, name: str, data: bytes) -> Path:
        p = self.dir / name
        p.write_bytes(data)
        return p

    def issue(self, ca: Any, name: str, *hosts: str) -> tuple[Path, Path]:
        c = ca.issue_cert(*hosts)
        return (self._write(f"{name}.pem", b"".join(p.bytes() for p in c.cert_chain_pems)),
                self._write(f"{name}.key", c.private_key_pem.bytes()))


@pytest.fixture
def pki(tmp_path) -> Pki:
    return Pki(tmp_path / "pki")


def _tls_client(cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def peer_cert(port: int) -> bytes:
    """The DER certificate the server at 127.0.0.1:port shows to a new TLS connection (no verification)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, _tls_client().wrap_socket(raw) as s:
        der = s.getpeercert(binary_form=True)
    assert der
    return der


def server_speaks(port: int, cert: Path | None = None, key: Path | None = None) -> bool:
    """Whether the server sends its first HTTP/2 bytes to a TLS client showing ``cert`` (TLS 1.3 checks a
    client certificate after the client's side of the handshake: a refusal is an alert or a close)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                _tls_client(cert, key).wrap_socket(raw) as s:
            return s.recv(1) != b""
    except (ssl.SSLError, ConnectionError):
        return False


def der(pem_file: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem_file.read_text().split("-----END CERTIFICATE-----")[0]
                                    + "-----END CERTIFICATE-----\n")


def ads_listener(port: int, root: Path, cert: Path | None = None, key: Path | None = None) -> Any:
    """One ADS request for Listener 'tls' over TLS trusting ``root`` (with a client certificate): its response."""
    import grpc
    from envoy.service.discovery.v3 import discovery_pb2

    creds = grpc.ssl_channel_credentials(root.read_bytes(), key and key.read_bytes(), cert and cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        ads = ch.stream_stream(ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                               response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        responses = ads(iter([discovery_pb2.DiscoveryRequest(type_url=LISTENER, resource_names=["tls"])]), timeout=10)
        try:
            return next(responses)
        finally:
            responses.cancel()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=60, check=False)


# -- ServerTls in process: reads only on change, keeps the last good files -----------------------------------

def test_reload_reads_only_changed_files_and_keeps_the_last_good_ones(pki, tmp_path, caplog, monkeypatch) -> None:
    from waypost.xds import tls

    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(pki.cert.read_bytes())
    key.write_bytes(pki.key.read_bytes())
    server = ServerTls(TlsFiles(str(cert), str(key)))
    loads = []
    real_load = tls._load
    monkeypatch.setattr(tls, "_load", lambda files: loads.append(1) or real_load(files))
    assert [server.reload() for _ in range(100)] == [None] * 100 and not loads  # unchanged: stat only

    new_ca = trustme.CA()
    new = new_ca.issue_cert("localhost", "127.0.0.1")
    chain = b"".join(p.bytes() for p in new.cert_chain_pems)
    caplog.set_level(logging.INFO, logger="waypost.xds")
    cert.write_bytes(chain[: len(chain) // 2])  # half written: the old pair stays, one warning names the file
    for _ in range(5):
        assert server.reload() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(cert) in warnings[0] and "not a PEM certificate" in warnings[0], warnings
    assert len(loads) == 1  # the bad files are not read again until they change

    cert.write_bytes(chain)  # the whole new chain, but the old key: it does not belong
    assert server.reload() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and str(key) in warnings[1] and "does not belong" in warnings[1], warnings

    key.write_bytes(new.private_key_pem.bytes())
    assert server.reload() is not None and server.reloads == 1
    assert server.reload() is None
    assert any("re-read" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)

    os.replace(pki.cert, cert)  # an atomic rename back to the first certificate (a new inode, maybe the same size)
    os.replace(pki.key, key)
    assert server.reload() is not None and server.reloads == 2


@pytest.mark.parametrize("case", ["missing", "directory", "not-pem", "mismatch", "bad-ca", "bad-key"])
def test_bad_files_raise_one_error_naming_the_file(pki, tmp_path, case) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    files, field, path, says = {
        "missing": (TlsFiles(str(tmp_path / "nope.pem"), str(pki.key)), "cert", tmp_path / "nope.pem", "no such file"),
        "directory": (TlsFiles(str(pki.cert), str(tmp_path)), "key", tmp_path, "is a directory"),
        "not-pem": (TlsFiles(str(garbage), str(pki.key)), "cert", garbage, "not a PEM certificate"),
        "mismatch": (TlsFiles(str(pki.cert), str(pki.client_key)), "key", pki.client_key, "does not belong"),
        "bad-ca": (TlsFiles(str(pki.cert), str(pki.key), str(garbage)), "client_ca", garbage, "not a PEM certificate"),
        "bad-key": (TlsFiles(str(pki.cert), str(garbage)), "key", garbage, "not a PEM private key"),
    }[case]
    with pytest.raises(TlsFileError) as e:
        ServerTls(files)
    assert e.value.field == field and e.value.path == str(path) and says in str(e.value)


def test_an_unreadable_file_says_to_check_its_permissions(pki, monkeypatch) -> None:
    from waypost.xds import tls

    def denied(path: str, mode: str = "r") -> Any:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(tls, "open", denied, raising=False)  # root reads any file: the error is made here
    with pytest.raises(TlsFileError, match=r"cannot read it \(Permission denied\): check its permissions"):
        ServerTls(TlsFiles(str(pki.cert), str(pki.key)))


def test_config_file_tls_table(pki) -> None:
    cfg = parse_config(f'[tls]\ncert = "{pki.cert}"\nkey = "{pki.key}"\nclient_ca = "{pki.ca_file}"\n', "x.toml")
    assert cfg.tls == TlsFiles(str(pki.cert), str(pki.key), str(pki.ca_file)) and cfg.exports == ()
    assert parse_config(json.dumps({"exports": {"a": "direct:///127.0.0.1:1"}}), as_json=True).tls is None
    for body, says in [('tls = "x"', "expected a table"), ('[tls]\ncert = "c"', "'key' is missing"),
                       ('[tls]\ncert = "c"\nkey = 3', "key must be a file path"),
                       ('[tls]\ncert = "c"\nkey = "k"\nca = "x"', "unknown key 'ca'")]:
        with pytest.raises(ValueError, match=says):
            parse_config(body, "x.toml")


# -- the CLI: errors, and the bootstrap ------------------------------------------------------------------------

def test_serve_errors_are_one_line_naming_the_flag_or_key(pki, tmp_path) -> None:
    serve = ("xds", "serve", "--listen", "127.0.0.1:0", "--export", "a=direct:///127.0.0.1:1")
    config = tmp_path / "xds.toml"
    config.write_text(f'[exports]\na = "direct:///127.0.0.1:1"\n[tls]\ncert = "{pki.cert}"\n'
                      f'key = "{tmp_path / "gone.key"}"\n')
    cases = [
        ((*serve, "--tls-cert", str(tmp_path / "gone.pem"), "--tls-key", str(pki.key)),
         f"Error: --tls-cert {tmp_path / 'gone.pem'}: no such file"),
        ((*serve, "--tls-cert", str(pki.cert), "--tls-key", str(pki.client_key)),
         f"Error: --tls-key {pki.client_key}: does not belong to the certificate in {pki.cert}"),
        ((*serve, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--client-ca", str(pki.key)),
         f"Error: --client-ca {pki.key}: not a PEM certificate"),
        ((*serve, "--client-ca", str(pki.ca_file)), "Error: --client-ca needs --tls-cert and --tls-key"),
        ((*serve, "--tls-cert", str(pki.cert)), "Error: --tls-cert and --tls-key go together"),
        (("xds", "serve", "--listen", "127.0.0.1:0", "--config", str(config)),
         f"Error: {config}: tls.key {tmp_path / 'gone.key'}: no such file"),
        (("xds", "serve", "--listen", "127.0.0.1:0", "--config", str(config), "--tls-cert", str(pki.cert),
          "--tls-key", str(pki.key)), "Error: TLS is given both by --tls-cert and in the [tls] table"),
    ]
    for argv, first in cases:
        out = cli(*argv)
        lines = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
        assert out.returncode != 0 and len(lines) == 1 and lines[0].startswith(first), (argv, out.stderr)
        assert "Traceback" not in out.stderr


def test_bootstrap_tls_channel_creds(pki) -> None:
    out = cli("xds", "bootstrap", "--server", "cp:18000", "--tls", "--ca-file", str(pki.ca_file), "--cert-file",
              str(pki.client_cert), "--key-file", str(pki.client_key), "--refresh-interval", "30")
    assert out.returncode == 0, out.stderr
    [server] = json.loads(out.stdout)["xds_servers"]
    assert server["channel_creds"] == [{"type": "tls", "config": {
        "ca_certificate_file": str(pki.ca_file), "certificate_file": str(pki.client_cert),
        "private_key_file": str(pki.client_key), "refresh_interval": "30s"}}]
    plain = json.loads(cli("xds", "bootstrap", "--server", "cp:18000", "--tls").stdout)
    assert plain["xds_servers"][0]["channel_creds"] == [{"type": "tls", "config": {}}]  # the system's roots
    assert json.loads(cli("xds", "bootstrap", "--server", "cp:1").stdout)["xds_servers"][0]["channel_creds"] == [
        {"type": "insecure"}]
    for argv, says in [(("--ca-file", "ca.pem"), "Error: --ca-file goes with --tls"),
                       (("--tls", "--cert-file", "c.pem"), "Error: bootstrap: --cert-file and --key-file go together")]:
        out = cli("xds", "bootstrap", "--server", "cp:1", *argv)
        assert out.returncode != 0 and says in out.stderr, out.stderr


# -- a running `waypost xds serve`: rotation, mTLS refusals ------------------------------------------------------

def _serve(pki: Pki, tmp: Path, *, mtls: bool, exports: list[str] | None = None,
           registry: str | None = None) -> XdsServe:
    extra = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    if mtls:
        extra += ["--client-ca", str(pki.ca_file)]
    return XdsServe(exports or ["tls=direct:///127.0.0.1:1"], extra=tuple(extra), log=tmp / "serve.log",
                    registry=registry)


def test_certificates_rotate_without_a_restart(pki, tmp_path) -> None:
    serve = _serve(pki, tmp_path, mtls=False)
    try:
        assert peer_cert(serve.port) == der(pki.cert)
        assert ads_listener(serve.port, pki.ca_file).resources
        # a new CA and a new server certificate, written over the files in place
        rotated = Pki(tmp_path / "rotated")
        pki.cert.write_bytes(rotated.cert.read_bytes())
        pki.key.write_bytes(rotated.key.read_bytes())
        assert peer_cert(serve.port) == der(rotated.cert)  # the next connection sees it: no restart, no wait
        assert ads_listener(serve.port, rotated.ca_file).resources
        import grpc

        with pytest.raises(grpc.RpcError):  # the old CA no longer verifies it
            ads_listener(serve.port, pki.ca_file)
        # a half-written certificate: the last good one stays, one warning names the file
        pki.cert.write_bytes(rotated.cert.read_bytes()[:200])
        for _ in range(3):
            assert peer_cert(serve.port) == der(rotated.cert)
        wait_until(lambda: str(pki.cert) in serve.log(), 10, "the warning")
        warned = [line for line in serve.log().splitlines() if "keeping the certificate loaded before" in line]
        assert len(warned) == 1 and str(pki.cert) in warned[0] and "not a PEM certificate" in warned[0], warned
        assert serve.proc is not None and serve.proc.poll() is None
    finally:
        assert serve.terminate() == 0
        serve.close()


def test_mtls_refuses_clients_without_a_certificate_of_the_ca(pki, tmp_path) -> None:
    import grpc

    serve = _serve(pki, tmp_path, mtls=True)
    try:
        assert ads_listener(serve.port, pki.ca_file, pki.client_cert, pki.client_key).resources
        for cert, key in [(None, None), (pki.other_cert, pki.other_key)]:  # none, or one from another CA
            with pytest.raises(grpc.RpcError) as e:
                ads_listener(serve.port, pki.ca_file, cert, key)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
            assert not server_speaks(serve.port, cert, key)
        assert server_speaks(serve.port, pki.client_cert, pki.client_key)
        # gRPC's own log line (C-core, on the server's stderr) says why each was refused
        log = wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in (t := serve.log()) and t, 10, "the handshake log")
        assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in log
        # the client CA rotates too: certificates of the new CA are taken, the old CA's refused
        server_root = tmp_path / "server-root.pem"
        server_root.write_bytes(pki.ca_file.read_bytes())
        rotated = Pki(tmp_path / "rotated")
        pki.ca_file.write_bytes(rotated.ca_file.read_bytes())
        assert ads_listener(serve.port, server_root, rotated.client_cert, rotated.client_key).resources
        with pytest.raises(grpc.RpcError):
            ads_listener(serve.port, server_root, pki.client_cert, pki.client_key)
    finally:
        assert serve.terminate() == 0
        serve.close()


def _status(serve: XdsServe, *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("xds", "status", "--server", serve.address, *flags)


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed command wrote on stderr (click's ``Error: ...``), the exit status checked."""
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    return lines[0]


def test_status_without_tls_flags_says_the_control_plane_serves_tls(pki, tmp_path) -> None:
    """A plaintext ``waypost xds status`` to a TLS or an mTLS control plane: one line saying so and which flags to
    pass (gRPC alone says ``Socket closed``); with them it works."""
    tls, mtls = _serve(pki, tmp_path, mtls=False), _serve(pki, tmp_path, mtls=True)
    try:
        line = _one_error_line(_status(tls))
        assert line == (f"Error: the TLS handshake failed: the control plane at {tls.address} serves TLS and this "
                        "call was plaintext; pass --tls-ca (and --tls-cert/--tls-key if it asks for a client "
                        "certificate)"), line
        line = _one_error_line(_status(mtls))
        assert line == (f"Error: the TLS handshake failed: the control plane at {mtls.address} serves TLS and asks "
                        "for a client certificate (mTLS), and this call was plaintext; pass --tls-ca, --tls-cert "
                        "and --tls-key"), line
        ok = _status(tls, "--tls-ca", str(pki.ca_file))
        assert ok.returncode == 0 and f"no client connected to {tls.address}" in ok.stdout, ok.stderr
    finally:
        for serve in (tls, mtls):
            assert serve.terminate() == 0
            serve.close()


def test_status_against_mtls_says_a_client_certificate_is_required(pki, tmp_path) -> None:
    """``waypost xds status --tls-ca`` to an mTLS control plane: one line saying a client certificate is required;
    one from a CA it does not trust is said to be refused; TLS flags to a plaintext control plane, or a CA that did
    not sign its certificate, are named too."""
    mtls = _serve(pki, tmp_path, mtls=True)
    plain = XdsServe(["plain=direct:///127.0.0.1:1"], log=tmp_path / "plain.log")
    ca = ("--tls-ca", str(pki.ca_file))
    try:
        line = _one_error_line(_status(mtls, *ca))
        assert line == (f"Error: a client certificate is required: the control plane at {mtls.address} asks for one "
                        "(mTLS) and closed the connection without it; pass --tls-cert and --tls-key"), line
        line = _one_error_line(_status(mtls, *ca, "--tls-cert", str(pki.other_cert), "--tls-key", str(pki.other_key)))
        assert f"refused the client certificate {pki.other_cert}" in line, line
        line = _one_error_line(_status(mtls, "--tls-ca", str(pki.dir / "other.pem")))  # a client cert, not its CA
        assert f"the certificate of the control plane at {mtls.address} is not trusted by --tls-ca" in line, line
        line = _one_error_line(_status(plain, *ca))
        assert line == (f"Error: the TLS handshake failed: the control plane at {plain.address} does not serve TLS "
                        "(it answered in plaintext); leave out --tls-ca, --tls-cert and --tls-key"), line
        ok = _status(mtls, *ca, "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key))
        assert ok.returncode == 0 and f"no client connected to {mtls.address}" in ok.stdout, ok.stderr
        gone = plain.port
        assert plain.terminate() == 0
        line = _one_error_line(cli("xds", "status", "--server", f"127.0.0.1:{gone}", *ca))  # nothing listens
        assert line.startswith(f"Error: cannot reach 127.0.0.1:{gone}: "), line
    finally:
        assert mtls.terminate() == 0
        mtls.close()
        plain.close()


def test_serve_takes_tls_from_the_config_file(pki, tmp_path) -> None:
    import grpc

    config = tmp_path / "xds.json"
    config.write_text(json.dumps({"exports": {"tls": "direct:///127.0.0.1:1"},
                                  "tls": {"cert": str(pki.cert), "key": str(pki.key), "client_ca": str(pki.ca_file)}}))
    serve = XdsServe([], extra=("--config", str(config)), log=tmp_path / "serve.log")
    try:
        assert ads_listener(serve.port, pki.ca_file, pki.client_cert, pki.client_key).resources
        with pytest.raises(grpc.RpcError):  # client_ca: mTLS
            ads_listener(serve.port, pki.ca_file)
    finally:
        assert serve.terminate() == 0
        serve.close()


# -- stock clients through a TLS and an mTLS control plane (Echo backends registered in a real etcd) -------------

class Planes:
    """Backends a and b under one etcd key, exported as ``tlsbal`` by a TLS and by an mTLS ``waypost xds serve``."""

    def __init__(self, etcd: Any, tmp: Path) -> None:
        self.pki = Pki(tmp / "pki")
        key = f"tls{os.getpid()}-{time.monotonic_ns() % 10**9}.rpc"
        self.backends = Backends(etcd.url(), key)
        self.serves: dict[str, XdsServe] = {}
        try:
            for n in ("a", "b"):
                self.backends.add(n)
            for mode in ("tls", "mtls"):
                d = tmp / mode
                d.mkdir()
                self.serves[mode] = _serve(self.pki, d, mtls=mode == "mtls",
                                           exports=[f"tlsbal=etcd:///{etcd.endpoint}?key={key}"])
        except BaseException:
            self.close()
            raise

    def bootstrap(self, mode: str, client: str | None = None) -> str:
        """``waypost xds bootstrap --tls`` for the ``mode`` control plane; ``client``: "ca" (a certificate of the
        server's CA) or "other" (another CA's), None: no client certificate."""
        argv = ["xds", "bootstrap", "--server", self.serves[mode].address, "--tls", "--ca-file", str(self.pki.ca_file)]
        if client is not None:
            cert, key = {"ca": (self.pki.client_cert, self.pki.client_key),
                         "other": (self.pki.other_cert, self.pki.other_key)}[client]
            argv += ["--cert-file", str(cert), "--key-file", str(key)]
        out = cli(*argv)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def close(self) -> None:
        for s in self.serves.values():
            s.kill()
            s.close()
        self.backends.close()


@pytest.fixture(scope="module")
def planes(shared_etcd, tmp_path_factory) -> Iterator[Planes]:
    p = Planes(shared_etcd, tmp_path_factory.mktemp("tls-planes"))
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize(("mode", "client"), [("tls", None), ("mtls", "ca")])
def test_grpcio_stock_client_through_tls(planes, tmp_path, mode, client) -> None:
    """grpcio (C-core) reads A65 ``tls`` channel creds: server verified by the CA file, client certificate shown."""
    with stock_client(planes.bootstrap(mode, client), tmp_path) as c:
        got = picks_all(c, "tlsbal", {"a", "b"}, timeout=30)
        assert min(got.values()) >= 5, got


@pytest.mark.parametrize("client", [None, "other"], ids=["no-cert", "other-ca"])
def test_grpcio_stock_client_refused_by_mtls(planes, tmp_path, client) -> None:
    with stock_client(planes.bootstrap("mtls", client), tmp_path) as c:
        out = c.timed("tlsbal", 5)
    assert out["code"] == "UNAVAILABLE" and not out["server"], out
    print(f"\ngrpcio without a valid client certificate: {out['code']}: {out['details'][:300]}")


def _go_or_java(lang: str) -> None:
    if lang == "go":
        from tests.xds.go_peers import go_programs

        go_programs()  # build (or skip) before starting anything
    else:
        from tests.xds.java_peers import java_classpath

        java_classpath()


def _codes(result: dict[str, Any]) -> dict[str, int]:
    return {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}


@pytest.mark.usefixtures("xds_procs")
@pytest.mark.timeout(1500)  # a cold session builds the Go programs first
@pytest.mark.parametrize(("mode", "client"), [("tls", None), ("mtls", "ca"), ("mtls", None)],
                         ids=["tls", "mtls", "mtls-no-cert"])
def test_go_client_through_tls(planes, mode, client) -> None:
    """grpc-go reads A65 ``tls`` channel creds (internal/xds/bootstrap/tlscreds): TLS and mTLS reach the backends;
    with no client certificate the mTLS control plane refuses it and no call succeeds."""
    from tests.xds.xds_peers import run_xds_client

    _go_or_java("go")
    if client is None and mode == "mtls":
        result = run_xds_client("go", "xds:///tlsbal", planes.bootstrap(mode, client), 2, deadline=5.0, timeout=60)
        assert result["errors"] == 2 and _codes(result) == {"UNAVAILABLE": 2}, result
        print(f"\ngrpc-go without a client certificate: {result.get('first_error', '')[:300]}")
        return
    result = run_xds_client("go", "xds:///tlsbal", planes.bootstrap(mode, client), 40, deadline=10.0,
                            wait_for_ready=True)
    assert result["errors"] == 0 and set(result["counts"]) == {"a", "b"}, result


def _java_trust_store(pki: Pki) -> Path:
    """A PKCS12 trust store holding the server's CA, for the JVM's default TLS (javax.net.ssl.trustStore)."""
    store = pki.dir / "trust.p12"
    if not store.exists():
        tool = shutil.which("keytool")
        if tool is None:
            pytest.skip("keytool (JDK) is not on PATH")
        subprocess.run([tool, "-importcert", "-noprompt", "-alias", "waypost-ca", "-file", str(pki.ca_file),
                        "-keystore", str(store), "-storetype", "PKCS12", "-storepass", "changeit"],
                       check=True, capture_output=True, timeout=60)
    return store


@pytest.mark.usefixtures("xds_procs")
@pytest.mark.timeout(900)  # a cold session builds the Java client first
def test_java_client_tls_only_with_the_jvm_trust_store(planes, monkeypatch) -> None:
    """grpc-java 1.85.1 takes ``tls`` channel creds but ignores their config (TlsXdsCredentialsProvider returns
    TlsChannelCredentials.create()): ``ca_certificate_file`` is not read, the JVM's default trust store is, and
    ``certificate_file`` is not shown, so an mTLS control plane refuses it."""
    from tests.xds.xds_peers import run_xds_client

    _go_or_java("java")
    boot_tls, boot_mtls = planes.bootstrap("tls"), planes.bootstrap("mtls", "ca")
    # the CA file alone is not enough: the JVM does not trust the server's CA
    refused = run_xds_client("java", "xds:///tlsbal", boot_tls, 1, deadline=10.0, timeout=90)
    assert refused["errors"] == 1 and _codes(refused) == {"UNAVAILABLE": 1}, refused
    store = _java_trust_store(planes.pki)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-Djavax.net.ssl.trustStore={store} "
                       "-Djavax.net.ssl.trustStorePassword=changeit -Djavax.net.ssl.trustStoreType=PKCS12")
    result = run_xds_client("java", "xds:///tlsbal", boot_tls, 40, deadline=10.0, wait_for_ready=True)
    assert result["errors"] == 0 and set(result["counts"]) == {"a", "b"}, result
    # mTLS: the bootstrap's client certificate is not used, the control plane refuses the handshake
    refused = run_xds_client("java", "xds:///tlsbal", boot_mtls, 1, deadline=10.0, timeout=90)
    assert refused["errors"] == 1 and _codes(refused) == {"UNAVAILABLE": 1}, refused
    print(f"\ngrpc-java against mTLS: {refused.get('first_error', '')[:300]}")
