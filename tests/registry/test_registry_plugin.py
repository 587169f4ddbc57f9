"""A registry kind from outside waypost: the example ``files://`` kind (examples/registry_plugin), found through its
``waypost.registries`` entry point by processes that never import it by name, serving and dialing real gRPC
servers; a server SIGKILLed leaves a file that clients drop once it expires. Also: ``register_kind``'s checks, a
broken plug-in logged and skipped, and unknown schemes listing what is registered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from waypost import kind_table as kinds

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "registry_plugin"


def _dist(site: Path, entry: str) -> None:
    """An installed distribution as pip leaves it (a dist-info with METADATA and entry_points.txt) on ``site``."""
    info = site / "waypost_files-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: waypost-files\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[waypost.registries]\n{entry}\n")


def _env(site: Path) -> dict[str, str]:
    path = [str(site), str(PLUGIN), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _python(site: Path, code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(site), capture_output=True,
                          text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(autouse=True)
def _table_restored() -> Iterator[None]:
    """The kind table as it was after each test (the kinds a test registers are this process' only)."""
    kinds.load_plugins()  # waypost's own kinds are in the table before it is saved (else restoring drops them)
    saved = dict(kinds.KINDS), dict(kinds.SCHEMES)
    yield
    with kinds._lock:
        kinds.KINDS.clear()
        kinds.KINDS.update(saved[0])
        kinds.SCHEMES.clear()
        kinds.SCHEMES.update(saved[1])


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    _dist(site, "files = waypost_files:KIND")
    return site


SERVER = """
import sys, waypost
from harness.backends.server import EchoServer
echo = EchoServer(sys.argv[2])
handle = waypost.serve(echo.server, "greeter", listen_on="127.0.0.1:0", registry=sys.argv[1], ttl=3,
                       metadata={"zone": sys.argv[2]})
print(handle.address, flush=True)
handle.wait()
"""


class Server:
    def __init__(self, site: Path, url: str, name: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, url, name], env=_env(site), cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        assert self.address, f"server {name} did not start"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)


@pytest.fixture
def servers(site: Path, tmp_path: Path) -> Iterator[tuple[str, list[Server]]]:
    url = f"files://{tmp_path}/registry"
    started = [Server(site, url, "a"), Server(site, url, "b")]
    try:
        yield url, started
    finally:
        for s in started:
            s.stop(signal.SIGKILL)


def test_the_entry_point_is_read_only_when_its_scheme_is_used(site: Path) -> None:
    out = _python(site, """
        import sys, waypost
        from waypost.resolver.target import parse_target
        from waypost import kind_table as kinds
        before = "waypost_files" in sys.modules
        t = parse_target("files:///srv/registry/greeter?interval=0.2s")
        print(before, t.scheme, t.key, t.authority, t.options["interval"], kinds.KINDS["files"].title,
              "waypost_files" in sys.modules)
    """)
    assert out.split() == ["False", "files", "greeter", "/srv/registry", "0.2", "files", "True"]


def test_serve_and_dial_through_the_plugin_kind_and_a_killed_server_expires(site: Path, servers, tmp_path) -> None:
    url, (a, b) = servers
    files = sorted(p.name for p in (tmp_path / "registry" / "greeter").glob("*.json"))
    assert files == sorted(f"{s.address.replace(':', '_')}.json" for s in (a, b))
    # a client in another process, which knows the kind only through the entry point too
    out = _python(site, f"""
        import json, waypost
        from harness.backends import echo_pb2, echo_pb2_grpc
        with waypost.dial({url + "/greeter?interval=0.2s"!r}, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            print(json.dumps(sorted({{stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=5).server
                                     for _ in range(20)}})))
    """)
    assert json.loads(out) == ["a", "b"]

    # in this process: register the kind explicitly (what the entry point does), then kill a server
    sys.path.insert(0, str(PLUGIN))
    try:
        import waypost_files
    finally:
        sys.path.remove(str(PLUGIN))
    waypost.register_kind(waypost_files.KIND, replace=True)
    with waypost.dial(url + "/greeter?interval=0.2s", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)

        def answered() -> set[str]:
            return {stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=5).server for _ in range(10)}

        wait_until(lambda: answered() == {"a", "b"}, what="both servers answer")
        a.stop(signal.SIGKILL)  # no deregistration: its file stays until it expires (ttl=3)
        assert (tmp_path / "registry" / "greeter" / f"{a.address.replace(':', '_')}.json").exists()
        wait_until(lambda: answered() == {"b"}, timeout=20, what="the killed server's file expired")
        b.stop()  # SIGTERM: deregistered (its file deleted) before the server drains
        assert not (tmp_path / "registry" / "greeter" / f"{b.address.replace(':', '_')}.json").exists()


def test_a_broken_plugin_is_logged_and_skipped(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _dist(site, "nacos = no_such_module:KIND")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import logging, waypost
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        try:
            waypost.parse_target("nacos://127.0.0.1:8848/greeter")
        except waypost.InvalidTarget as e:
            print("refused:", e)
        print(waypost.parse_target("direct:///127.0.0.1:1").scheme)
    """)], env=_env(site), capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert "registry plug-in 'nacos' (no_such_module:KIND) not loaded: No module named 'no_such_module'" in done.stderr
    assert "refused: unknown target scheme 'nacos'" in done.stdout and "direct\n" in done.stdout


def test_register_kind_refuses_taken_schemes_and_empty_kinds() -> None:
    with pytest.raises(ValueError, match="scheme 'consul' is taken by the Consul kind"):
        waypost.register_kind(waypost.RegistryKind("consul", 8500, "consul://h/s", discovery="x:y"))
    with pytest.raises(ValueError, match="needs a discovery"):
        waypost.register_kind(waypost.RegistryKind("nothing", None, "nothing:///x"))
    with pytest.raises(ValueError, match="is not a URL scheme"):
        waypost.RegistryKind("Bad_Scheme", None, "x")
    with pytest.raises(TypeError, match="expected a waypost.RegistryKind"):
        waypost.register_kind("files")  # type: ignore[arg-type]


def test_a_registered_kind_is_listed_in_unknown_scheme_errors_and_parsed_by_the_default_grammar() -> None:
    kind = waypost.RegistryKind("examplereg", 7777, "examplereg://127.0.0.1:7777/greeter", discovery="x:y",
                                target_params=("token",), max_hosts=2)
    waypost.register_kind(kind)
    t = waypost.parse_target("examplereg://10.0.0.1,10.0.0.2:7000/greeter?token=t")
    assert (t.scheme, t.endpoints, t.key, dict(t.options)) == (
        "examplereg", ("10.0.0.1:7777", "10.0.0.2:7000"), "greeter", {"token": "t"})
    with pytest.raises(waypost.InvalidTarget, match="unknown query parameter 'tag'.*expected one of: token"):
        waypost.parse_target("examplereg://10.0.0.1/greeter?tag=x")
    with pytest.raises(waypost.InvalidTarget, match="names at most 2 hosts"):
        waypost.parse_target("examplereg://a:1,b:1,c:1/greeter")
    with pytest.raises(waypost.InvalidTarget, match=r"known schemes: .*zk, (.*, )?examplereg, ipv4"):
        waypost.parse_target("nacos://127.0.0.1:8848/greeter")
