"""The examples run as written: a sync and an aio server, a sync and an aio client and the custom policy's client,
against a real etcd."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import waypost
from waypost.etcd.local import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start_server(script: str, url: str, key: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    # POD_IP unset: an environment that has it would otherwise decide the address of a wildcard --listen
    env = {k: v for k, v in os.environ.items() if k != "POD_IP"}
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / script), "--registry", url, "--key", key, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[-1]


def run_client(script: str, target: str, *extra: str) -> list[str]:
    out = subprocess.run([sys.executable, str(EXAMPLES / script), "--target", target, "-n", "8", *extra],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_examples_end_to_end(shared_etcd, unique_key):
    url = shared_etcd.url()
    procs = []
    try:
        port = free_port()
        sync_srv, a1 = start_server("server.py", url, unique_key, "--listen", f"127.0.0.1:{port}")
        procs.append(sync_srv)
        assert a1 == f"127.0.0.1:{port}"  # the --listen host and port, as given
        # every interface, and the address to register given, as for a server other hosts call
        aio_srv, a2 = start_server("aio_server.py", url, unique_key, "--listen", "0.0.0.0:0", "--advertise",
                                   "127.0.0.1")
        procs.append(aio_srv)
        assert a2.startswith("127.0.0.1:") and a2 != "127.0.0.1:0", a2  # --advertise's host, the bound port
        target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"

        for script, extra in (("client.py", ("--balancer", "round_robin")), ("aio_client.py", ()),
                              ("custom_policy.py", ()), ("hedging_client.py", ())):
            seen: set[str] = set()
            # A fresh channel may answer its first calls from the backend that connected first: run the
            # client a few times (each run is a new process) until both servers have answered.
            # custom_policy.py waits for every backend before its first call: one run sees both.
            for _ in range(1 if script == "custom_policy.py" else 3):
                lines = run_client(script, target, *extra)
                assert len(lines) == 8 and all(line.startswith("hello call ") for line in lines), lines
                seen |= {line.split()[-1] for line in lines}
                if seen == {a1, a2}:
                    break
            assert seen == {a1, a2}, (script, seen)

        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=30) == 0
            assert p.stdout.read().strip().endswith("stopped")
        assert waypost.connect(url).sync.get(unique_key + "/", prefix=True).kvs == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
            p.stdout.close()
            p.stderr.close()


def test_generated_code_matches_proto():
    # The committed stubs come from greet.proto (regenerate with examples/generate.sh).
    sys.path.insert(0, str(EXAMPLES))
    try:
        import greet_pb2
        import greet_pb2_grpc
    finally:
        sys.path.remove(str(EXAMPLES))
    desc = greet_pb2.DESCRIPTOR.services_by_name["Greeter"]
    assert [m.name for m in desc.methods] == ["SayHello"]
    assert hasattr(greet_pb2_grpc, "GreeterStub") and hasattr(greet_pb2_grpc, "add_GreeterServicer_to_server")
    assert "rpc SayHello" in (EXAMPLES / "greet.proto").read_text()


def test_the_example_servers_default_to_loopback(shared_etcd, unique_key):
    """Without flags a server listens and registers on loopback (what works on a laptop), not on the wildcard
    with this host's interface address."""
    for script in ("server.py", "aio_server.py"):
        proc, address = start_server(script, shared_etcd.url(), unique_key)
        try:
            assert address.startswith("127.0.0.1:"), (script, address)
            registered = [kv.value.decode() for kv in
                          waypost.connect(shared_etcd.url()).sync.get(unique_key + "/", prefix=True).kvs]
            assert address in registered, (script, registered)
        finally:
            if proc.poll() is None:
                proc.kill()  # its deregistration is test_examples_end_to_end's to check
                proc.wait(5)
            proc.stdout.close()
            proc.stderr.close()
