"""The pieces of an xDS test: ``waypost xds serve`` as a process, the Go and Java xDS clients, and the Echo
backends registered with ``waypost.serve`` that they reach.

xDS helpers: ``xds_control_plane(exports, registry=None) -> (addr, bootstrap_json, proc)`` runs
``python -m waypost.cli xds serve`` (stop it with ``proc.stop()``); ``run_xds_client(lang, target, bootstrap,
calls, ...)`` ("go" or "java") runs one client to the end; ``start_xds_client(...)`` returns a running one
(``.progress()``, ``.finish()``) so a test can watch traffic move during a run; ``watch(run, pred, timeout, what)``
waits for a batch whose counts satisfy ``pred``. Backends: ``serve_echo`` (in process) and ``start_echo_process``
(a process of its own, for SIGTERM) register Echo servers with ``waypost.serve``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.xds.go_peers import go_programs
from tests.xds.java_peers import JAVA_MAIN, java_binary, java_classpath
from tests.xds.orca_peers import ClientRun, client_args
from tests.xds.peer_procs import ROOT, PeerProc

# -- xDS: control plane and clients --------------------------------------------------------------------------

def xds_control_plane(exports: Mapping[str, str], registry: str | None = None, *,
                      extra_args: Sequence[str] = (), timeout: float = 60.0) -> tuple[str, str, PeerProc]:
    """``python -m waypost.cli xds serve --listen 127.0.0.1:0 --export NAME=TARGET ...`` as a subprocess;
    returns (its address, the client bootstrap JSON from ``waypost xds bootstrap``, the process). An export's
    value may carry options after the target (``"KEY policy=ring_hash hash_header=x-key"``)."""
    pytest.importorskip("envoy.service.discovery.v3.ads_pb2",
                        reason="waypost's xDS control plane needs the xds extra (xds-protos)")
    argv = [sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0"]
    if registry:
        argv += ["--registry", registry]
    for name, target in exports.items():
        argv += ["--export", f"{name}={target}"]
    argv += list(extra_args)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = PeerProc(argv, "waypost-xds-serve", env=env, cwd=ROOT)
    try:
        line = proc.expect(lambda d: str(d.get("raw", "")).startswith("xds: serving on"), timeout,
                           "'xds: serving on HOST:PORT'")
        addr = line["raw"].split("xds: serving on", 1)[1].strip()
        boot = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "bootstrap", "--server", addr,
                               "--node-id", f"waypost-interop-{os.getpid()}"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env}, cwd=ROOT, check=False)
        if boot.returncode != 0:
            raise AssertionError(f"waypost xds bootstrap failed ({boot.returncode}): {boot.stderr[-2000:]}")
        json.loads(boot.stdout)  # it is the JSON itself
    except BaseException:
        proc.stop()
        raise
    return addr, boot.stdout, proc


def start_xds_client(lang: str, target: str, bootstrap: str, calls: int, *, interval: float = 0.0,
                     batch: int = 0, headers: Mapping[str, str] | None = None, keys: int = 0,
                     deadline: float = 5.0, wait_for_ready: bool = False, max_time: float = 300.0) -> ClientRun:
    """A grpc-go (``lang="go"``) or grpc-java (``"java"``) client of ``target`` (xds:///NAME) running."""
    args = client_args(calls, batch, interval, deadline, headers, keys, wait_for_ready, max_time)
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap}
    if lang == "go":
        run = ClientRun([str(go_programs()["xds-client"]), "-target", target, *args], "xds-client-go", env=env)
    elif lang == "java":
        java = java_binary()
        assert java is not None
        cp = java_classpath()
        run = ClientRun([java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", cp,
                         JAVA_MAIN, "-target", target, *args], "xds-client-java", env=env)
    else:
        raise ValueError(f"lang must be 'go' or 'java', not {lang!r}")
    run.batches = []
    return run


def run_xds_client(lang: str, target: str, bootstrap: str, calls: int, *, interval: float = 0.0, batch: int = 0,
                   headers: Mapping[str, str] | None = None, keys: int = 0, deadline: float = 5.0,
                   wait_for_ready: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Run one xDS client to its end; returns its final line with ``batches``."""
    run = start_xds_client(lang, target, bootstrap, calls, interval=interval, batch=batch, headers=headers,
                           keys=keys, deadline=deadline, wait_for_ready=wait_for_ready, max_time=timeout)
    try:
        return run.finish(timeout + 30.0)
    finally:
        run.stop()


# -- backends: waypost.serve'd Echo servers (in process, or a process of their own) ----------------------------

def serve_echo(name: str, key: str, registry: str, *, metadata: Mapping[str, Any] | None = None,
               grace: float = 3.0) -> Any:
    """An Echo server (replies name ``name``) started and registered under ``key`` with ``waypost.serve``;
    returns its ServeHandle (``.stop(grace)`` deregisters, keeps serving for serve()'s drain delay, then stops)."""
    from concurrent import futures

    import grpc

    import waypost
    from harness.backends import echo_pb2_grpc
    from harness.backends.server import EchoServicer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
    return waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry, metadata=metadata, grace=grace,
                         register_timeout=30.0)


_BACKEND_SCRIPT = """
import json, sys
from concurrent import futures
import grpc
import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer

name, key, registry = sys.argv[1:4]
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
handle = waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry, grace=5.0, register_timeout=30.0)
print(json.dumps({"ready": handle.address}), flush=True)
handle.wait()
print(json.dumps({"exited": name}), flush=True)
"""


def start_echo_process(name: str, key: str, registry: str, timeout: float = 60.0) -> PeerProc:
    """``waypost.serve`` of an Echo server in a Python process of its own (SIGTERM: its graceful stop)."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = PeerProc([sys.executable, "-c", _BACKEND_SCRIPT, name, key, registry], f"echo-{name}", env=env, cwd=ROOT)
    try:
        proc.expect(lambda d: "ready" in d, timeout, "ready")
    except BaseException:
        proc.stop()
        raise
    return proc
