"""``waypost xds bootstrap`` and ``waypost xds serve`` with the global ``--registry`` (bare keys, ``--prefix``), driven
by the examples: examples/server.py registers in etcd, examples/xds/client.py (plain grpcio) and the Go client
of examples/xds/go-client call it through the control plane."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from harness.waiting import wait_until
from tests.xds.test_xds_support import ROOT, XdsServe, _env

EXAMPLES = ROOT / "examples"
GO_CACHE = Path(os.environ.get("WAYPOST_SERVERS_CACHE", Path.home() / ".cache" / "waypost-servers"))


def test_bootstrap_prints_every_server() -> None:
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server", "10.0.0.1:18000",
                          "--server", "10.0.0.2:18000", "--node-id", "n1"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=60, check=True)
    doc = json.loads(out.stdout)
    assert [s["server_uri"] for s in doc["xds_servers"]] == ["10.0.0.1:18000", "10.0.0.2:18000"]
    assert doc["xds_servers"][0]["server_features"] == ["xds_v3", "ignore_resource_deletion"]
    assert doc["node"]["id"] == "n1"


@pytest.fixture(scope="module")
def greet(shared_etcd, tmp_path_factory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("xds-cli")
    key = f"xdscli{os.getpid()}/greet.rpc"
    url = shared_etcd.url()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "server.py"), "--registry", url, "--key", key],
                              stdout=subprocess.PIPE, text=True, env={**_env(), "POD_IP": "127.0.0.1"})
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.startswith("serving "), line
    serve = XdsServe(["greeter=" + key], extra=("--prefix", key.split("/")[0] + "/"), log=tmp / "serve.log",
                     registry=url)
    try:
        yield {"serve": serve, "key": key, "tmp": tmp, "address": line.split()[-1]}
    finally:
        serve.close()
        server.terminate()
        server.wait(15)


def _run(cmd: list[str], bootstrap: str, cwd: Path = ROOT) -> list[str]:
    out = subprocess.run(cmd, cwd=cwd, env=_env(GRPC_XDS_BOOTSTRAP_CONFIG=bootstrap), capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_python_example_client_through_a_key_and_a_prefix(greet) -> None:
    bootstrap = greet["serve"].bootstrap()
    # as examples/xds/README.md runs it: the client's default target is the name the docs export
    lines = _run([sys.executable, str(EXAMPLES / "xds" / "client.py"), "--calls", "3"], bootstrap)
    assert len(lines) == 3 and all(line.endswith("from " + greet["address"]) for line in lines), lines
    wait_until(lambda: "new service" in greet["serve"].log(), 20, "the prefix scan finds the key")
    lines = _run([sys.executable, str(EXAMPLES / "xds" / "client.py"), "--target", f"xds:///{greet['key']}",
                  "--calls", "2"], bootstrap)
    assert len(lines) == 2, lines


#: the xDS name of the greet service in the docs and examples (docs/xds.md's quick start exports it)
EXAMPLE_NAME = "greeter"


def test_docs_and_examples_use_one_xds_name() -> None:
    """docs/xds.md, README.md and examples/xds name the greet service alike: a reader mixing them (the docs' export,
    the example client's default target) gets calls served, not DEADLINE_EXCEEDED."""
    import re

    texts = {p: p.read_text() for p in [ROOT / "docs" / "xds.md", ROOT / "README.md", EXAMPLES / "xds" / "README.md",
                                        EXAMPLES / "xds" / "client.py", EXAMPLES / "xds" / "xds.yaml",
                                        EXAMPLES / "xds" / "go-client" / "main.go"]}
    names: dict[str, set[str]] = {}
    for path, text in texts.items():
        for m in re.finditer(r"xds:///([A-Za-z0-9._-]+)|--export[ ,\"']+([A-Za-z0-9._-]+)=(?:etcd|k8s|greet)", text):
            names.setdefault(m[1] or m[2], set()).add(path.name)
    greet = {n: where for n, where in names.items() if n.startswith("greet")}
    assert set(greet) == {EXAMPLE_NAME}, greet
    assert {"xds.md", "client.py", "xds.yaml", "main.go"} <= greet[EXAMPLE_NAME], greet


def _go_client() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed")
    src = EXAMPLES / "xds" / "go-client"
    digest = hashlib.sha256(b"".join((src / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))).hexdigest()
    binary = GO_CACHE / f"xds-go-client-{digest[:16]}"
    if not binary.exists():
        GO_CACHE.mkdir(parents=True, exist_ok=True)
        build = subprocess.run([go, "build", "-o", str(binary), "."], cwd=src, capture_output=True, text=True,
                               timeout=300, check=False, env={**os.environ, "GOFLAGS": "-mod=mod"})
        if build.returncode != 0:
            pytest.skip(f"the Go example did not build here (module cache or proxy unavailable): "
                        f"{build.stderr.strip()[-300:]}")
    return binary


def test_go_example_client(greet) -> None:
    binary = _go_client()
    lines = _run([str(binary), "-calls", "3"], greet["serve"].bootstrap())  # its default target
    assert len(lines) == 3 and all(line.endswith("from " + greet["address"]) for line in lines), lines


def test_serve_over_tls(tmp_path) -> None:
    """--tls-cert/--tls-key: the ADS endpoint answers over TLS (a gRPC client trusting the CA gets a Listener)."""
    trustme = pytest.importorskip("trustme")
    import grpc
    from envoy.service.discovery.v3 import discovery_pb2

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    serve = XdsServe(["tls=direct:///127.0.0.1:1"], extra=("--tls-cert", str(cert_file), "--tls-key", str(key_file)))
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        with grpc.secure_channel(f"localhost:{serve.port}", creds) as channel:
            ads = channel.stream_stream(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
            request = discovery_pb2.DiscoveryRequest(
                type_url="type.googleapis.com/envoy.config.listener.v3.Listener", resource_names=["tls"])
            responses = ads(iter([request]), timeout=20)
            first = next(responses)
            responses.cancel()
        assert [r.type_url for r in first.resources] == [request.type_url] and first.version_info
        with grpc.insecure_channel(f"127.0.0.1:{serve.port}") as plain, pytest.raises(grpc.RpcError):
            next(plain.stream_stream(  # no TLS: no answer
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(iter([request]), timeout=3))
    finally:
        assert serve.terminate() == 0
        serve.close()


def test_serve_from_a_config_file_with_metrics(tmp_path) -> None:
    import urllib.request

    from tests.xds.test_xds_support import free_port

    config = tmp_path / "xds.json"
    config.write_text(json.dumps({"exports": {"a": {"target": "direct:///127.0.0.1:1", "policy": "ring_hash"},
                                              "b": "direct:///127.0.0.1:2"}}))
    port = free_port()
    serve = XdsServe([], extra=("--config", str(config), "--metrics-port", str(port)), log=tmp_path / "serve.log")
    try:
        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()

        text = wait_until(lambda: 'waypost_xds_resources{type="CDS"} 2.0' in (s := scrape()) and s, 20,
                          "the metrics count both exports")
        assert "waypost_xds_streams 0.0" in text
    finally:
        assert serve.terminate() == 0
        serve.close()


def test_serve_refuses_a_quoted_split_weight_in_one_line(tmp_path) -> None:
    """``split = { v1 = 90, v2 = "10" }``: the weights are integers; the error names the file, export, field and
    value, and serve exits 1 without serving."""
    config = tmp_path / "canary.toml"
    config.write_text('[exports.canary]\ntarget = "direct:///127.0.0.1:1"\nsubset_key = "version"\n'
                      'split = { v1 = 90, v2 = "10" }\n')
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0", "--config",
                          str(config)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    said = (f"Error: {config}: export 'canary': split: v2: expected an integer from 0 to 1000000, got the string '10' "
            "(write v2 = 10, without quotes)")
    assert out.stderr.splitlines() == [said], out.stderr
