"""The native ADS engine (``native/xds-engine``, Rust) serving a stock grpcio ``xds:///`` client: the resources
waypost's builders make, handed over serialized; a push when an endpoint joins; the client's ACKs and a NACK in the
engine's per-stream view (what CSDS would show).

The engine is built with cargo (``harness/native_engine.py``: cached, a cold build takes minutes, which
``python -m tests.prebuild`` does before the suite); without cargo these tests skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from envoy.config.cluster.v3 import cluster_pb2

from harness import native_engine
from harness.backends.server import EchoServer
from harness.go_servers import BuildError
from harness.waiting import wait_until
from tests.xds.test_xds_support import ROOT, Backends, StockClient, XdsServe, _env, picks_all, stock_client
from waypost.types import Backend
from waypost.xds import parse_export
from waypost.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, load_assignment, static_resources

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # the first run builds the engine (minutes)

TYPES = (LISTENER, ROUTE, CLUSTER, ENDPOINT)


@pytest.fixture(scope="module")
def engine_dir() -> Path:
    reason = native_engine.skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        return native_engine.build(timeout=1100)
    except BuildError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def engine_module(engine_dir: Path) -> Any:
    where = engine_dir
    sys.path.insert(0, str(where))
    try:
        import waypost_xds_engine
    finally:
        sys.path.remove(str(where))
    return waypost_xds_engine


@pytest.fixture(scope="module")
def served(engine_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("native")
    servers = {n: EchoServer(n).start() for n in ("a", "b", "c")}
    export = parse_export("svc=direct:///127.0.0.1:1")
    engine = engine_module.Engine(workers=1)
    for type_url, msg in static_resources(export).items():
        engine.set_resources(type_url, {export.name: msg.SerializeToString()}, "1")
    engine.set_resources(ENDPOINT, {export.name: _assignment(export, servers, "a", "b")}, "1")
    port = engine.start("127.0.0.1:0")
    bootstrap = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server",
                                f"127.0.0.1:{port}", "--node-id", "native-test-client"], cwd=ROOT, env=_env(),
                               capture_output=True, text=True, timeout=60, check=True).stdout
    try:
        with stock_client(bootstrap, tmp) as client:
            yield {"engine": engine, "client": client, "export": export, "servers": servers}
    finally:
        engine.stop()
        for s in servers.values():
            s.stop(0)


def _assignment(export: Any, servers: dict[str, EchoServer], *names: str) -> bytes:
    return load_assignment(export, [Backend(servers[n].address) for n in names]).SerializeToString()


def _serve(served: dict[str, Any], *names: str) -> None:
    """The assignment of ``names``: each test sets the state it starts from (xdist may run them in any order)."""
    export, servers = served["export"], served["servers"]
    served["engine"].update_resources(ENDPOINT, {export.name: _assignment(export, servers, *names)},
                                      version="".join(names))


def _stream(engine: Any, node_id: str = "native-test-client") -> dict[str, Any] | None:
    return next((s for s in engine.streams() if s["node_id"] == node_id), None)


def test_serves_a_stock_client_and_pushes_an_endpoint_change(served: dict[str, Any]) -> None:
    engine, client, export, servers = served["engine"], served["client"], served["export"], served["servers"]
    _serve(served, "a", "b")
    assert picks_all(client, "svc", {"a", "b"})
    woken = engine.update_resources(ENDPOINT, {export.name: _assignment(export, servers, "a", "b", "c")},
                                    version="2")
    assert woken == 1  # the one stream subscribed to svc's assignment
    assert picks_all(client, "svc", {"a", "b", "c"})
    # the client ACKed every type at the version sent; nothing was NACKed
    stream = wait_until(lambda: (s := _stream(engine)) and s["types"].get(ENDPOINT, {}).get("acked_version") == "2"
                        and s, 10, "the client ACKs version 2 of the assignment")
    assert stream["user_agent_name"].startswith("gRPC C-core") and stream["user_agent_version"], stream
    assert set(stream["types"]) == set(TYPES)
    for type_url, sub in stream["types"].items():
        assert sub["names"] == ["svc"], (type_url, sub)
        assert sub["acked_version"] == sub["sent_version"], (type_url, sub)
        assert sub["nack_error"] is None and sub["nacks"] == 0, (type_url, sub)
        assert sub["last_nonce"], (type_url, sub)
    # a change of a name nobody subscribes to wakes nobody
    assert engine.update_resources(ENDPOINT, {"other": _assignment(export, servers, "a")}, version="3") == 0


def test_nack_keeps_the_last_good_version_and_is_shown(served: dict[str, Any]) -> None:
    engine, client, export = served["engine"], served["client"], served["export"]
    _serve(served, "a", "b", "c")
    assert picks_all(client, "svc", {"a", "b", "c"})
    acked = _stream(engine)["types"][CLUSTER]["acked_version"]  # type: ignore[index]
    bad = cluster_pb2.Cluster(name=export.name, type=cluster_pb2.Cluster.STATIC)  # gRPC takes EDS and DNS only
    assert engine.set_resources(CLUSTER, {export.name: bad.SerializeToString()}, "bad-1") == 1
    sub = wait_until(lambda: (s := _stream(engine)) and s["types"][CLUSTER]["nacks"] > 0 and s["types"][CLUSTER],
                     10, "the client NACKs the STATIC cluster")
    assert sub["nack_error"], sub
    assert sub["nacked_version"] == "bad-1" and sub["sent_version"] == "bad-1"
    assert sub["acked_version"] == acked  # the client keeps the last good cluster ...
    assert picks_all(client, "svc", {"a", "b", "c"})  # ... and calls go on over it
    # the good cluster again: ACKed, the error cleared
    good = static_resources(export)[CLUSTER].SerializeToString()
    assert engine.set_resources(CLUSTER, {export.name: good}, "good-2") == 1
    sub = wait_until(lambda: (s := _stream(engine)) and s["types"][CLUSTER]["acked_version"] == "good-2"
                     and s["types"][CLUSTER], 10, "the client ACKs the good cluster")
    assert sub["nack_error"] is None


def test_a_second_client_gets_the_current_state_and_a_closed_stream_leaves(served: dict[str, Any],
                                                                             tmp_path: Any) -> None:
    engine = served["engine"]
    bootstrap = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server",
                                f"127.0.0.1:{engine.port}", "--node-id", "second"], cwd=ROOT, env=_env(),
                               capture_output=True, text=True, timeout=60, check=True).stdout
    _serve(served, "a", "b", "c")
    assert picks_all(served["client"], "svc", {"a", "b", "c"})  # the first client's stream is open (alone too)
    second = StockClient(bootstrap, tmp_path)
    try:
        assert picks_all(second, "svc", {"a", "b", "c"})
        assert _stream(engine, "second") is not None
    finally:
        second.close()
    wait_until(lambda: _stream(engine, "second") is None, 10, "the second client's stream leaves the view")
    assert _stream(engine) is not None


def test_bad_input_is_refused_with_a_clear_error(engine_module: Any) -> None:
    engine = engine_module.Engine()
    with pytest.raises(ValueError, match="not a type URL"):
        engine.set_resources("Cluster", {}, "1")
    with pytest.raises(TypeError, match="not bytes"):
        engine.set_resources(CLUSTER, {"x": "text"}, "1")
    with pytest.raises(ValueError, match="workers must be at least 1"):
        engine_module.Engine(workers=0)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        engine.start("256.0.0.1:1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1:"):
            engine.start(f"127.0.0.1:{taken.getsockname()[1]}")
    assert engine.port is None


def test_xds_serve_engine_native_follows_the_registry(engine_dir: Path, shared_etcd: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``waypost xds serve --engine native``: the control plane follows etcd, the engine serves the streams."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(engine_dir), os.environ.get("PYTHONPATH", "")]))
    key = f"native{os.getpid()}.rpc"
    backends = Backends(shared_etcd.url(), key)
    serve = XdsServe([f"svc=etcd:///{shared_etcd.endpoint}?key={key}"], extra=("--engine", "native"),
                     log=tmp_path / "serve.log")
    try:
        backends.add("a")
        with stock_client(serve.bootstrap(), tmp_path) as client:
            assert picks_all(client, "svc", {"a"})
            backends.add("b")
            assert picks_all(client, "svc", {"a", "b"})
            backends.deregister("a")
            assert picks_all(client, "svc", {"b"})
            # a name not exported: no placeholder Listener here, the client's call fails (does not exist)
            assert client.timed("nope", 30)["code"] != "OK"
        assert serve.terminate() == 0, serve.log()[-3000:]
    finally:
        serve.close()
        backends.close()


def test_xds_serve_engine_native_refuses_what_it_cannot_do(engine_dir: Path) -> None:
    env = _env(PYTHONPATH=os.pathsep.join([str(engine_dir), str(ROOT), str(ROOT / "src")]))
    run = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "serve", "--engine", "native", "--workers",
                          "2", "--export", "svc=direct:///127.0.0.1:1"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode != 0 and "--engine native serves plaintext in one process: drop --workers" in run.stderr
    without = _env()
    run = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "serve", "--engine", "native", "--export",
                          "svc=direct:///127.0.0.1:1"], cwd=ROOT, env=without, capture_output=True, text=True,
                         timeout=60, check=False)
    if "not installed" not in run.stderr:  # the engine is installed in this virtualenv: nothing to refuse
        return
    assert run.returncode != 0 and "pip install ./native/xds-engine" in run.stderr
