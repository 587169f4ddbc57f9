"""Consul test harness: a real Consul agent (v1.14.11, built from the Go module proxy once, cached).

* ``consul_binary()`` builds consul v1.14.11 with the recipe of shared/notes/real-registries.md into
  ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/consul-v1.14.11-<go version hash>/consul`` (the build log
  beside it), under a file lock so that concurrent test processes build it once; bounded by
  ``$WAYPOST_CONSUL_BUILD_TIMEOUT`` (default 1200 s). ``$WAYPOST_CONSUL`` names an already built binary instead.
  ``skip_reason()`` says why the harness cannot run here (no Go, ...): tests call ``pytest.skip(reason)``.
* ``ConsulAgent``: ``consul agent -dev`` on free loopback ports (HTTP, server RPC, serf LAN/WAN; DNS and gRPC
  off), its data dir in a temporary directory; ``start()`` returns once ``/v1/status/leader`` names a leader;
  ``stop()``/``start()``/``restart()`` keep the same ports (a dev agent keeps no state across a restart: every
  registration is gone, as after a crash of a real agent whose data dir was lost). ``persistent=True``: a real
  single-server agent instead (``-server -bootstrap-expect=1``, its data dir kept across restarts: services,
  checks and the catalog survive, as in production). Small synchronous helpers on the HTTP API (stdlib urllib
  only, no waypost code) for the tests' "another client" view.
* ``HealthProxy``: a small HTTP server in this process in front of an agent, answering the health endpoint
  with other bodies first (what a proxy or another server at the agent's address would answer), forwarding
  everything else (and, once told to, the health endpoint too) to the real agent.

Every process here is started by this module and stopped by it by its PID (SIGTERM, SIGKILL after a bound);
``harness/proc_reaper.py`` stops what is left when the test process ends, killed or not.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import proc_reaper
from harness.go_servers import BuildError, GoServer, Unavailable
from waypost.etcd.local import free_port

CONSUL_VERSION = "v1.14.11"
#: cold: ~30 s module download + ~4 min compiling on 2 cores
#: per-test bound once the binary exists
TEST_TIMEOUT = 90.0

# The recipe of the note, command for command.
BUILD_SCRIPT = """set -e
printf 'module scratch/consulbuild\\n\\ngo 1.20\\n\\nrequire github.com/hashicorp/consul v1.14.11\\n' > go.mod
GOFLAGS=-mod=mod go get github.com/hashicorp/consul@v1.14.11
GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w -checklinkname=0" -o consul github.com/hashicorp/consul
"""


ConsulUnavailable = Unavailable  # the harness cannot run on this machine (the message says why): tests skip with it
ConsulBuildError = BuildError  # building consul failed (a real failure, not a skip)


class ConsulApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:300].decode(errors='replace')}")


# --------------------------------------------------------------------------------------------------- toolchain


CONSUL = GoServer("consul", CONSUL_VERSION, BUILD_SCRIPT, env_binary="WAYPOST_CONSUL",
                  timeout_env="WAYPOST_CONSUL_BUILD_TIMEOUT", default_timeout=1200.0, min_go=(1, 20))

_skip: list[str | None] = []


def skip_reason() -> str | None:
    """Why the Consul harness cannot run here, or None (computed once)."""
    if not _skip:
        off = os.environ.get("WAYPOST_CONSUL_TESTS", "1") == "0"
        _skip.append("Consul tests turned off by WAYPOST_CONSUL_TESTS=0" if off else CONSUL.skip_reason())
    return _skip[0]


def is_built() -> bool:
    return CONSUL.is_built()


def timeout_mark() -> Any:
    """pytest-timeout bound for a test whose setup may have to build consul (cold: minutes)."""
    import pytest

    return pytest.mark.timeout(TEST_TIMEOUT + (0 if is_built() else CONSUL.build_timeout()))


def consul_binary(timeout: float | None = None) -> Path:
    """The consul binary, built once per Go toolchain (harness/go_servers.py)."""
    reason = skip_reason()
    if reason is not None:
        raise ConsulUnavailable(reason)
    return CONSUL.binary(timeout)


# ------------------------------------------------------------------------------------------------- the agent

def _distinct_ports(n: int) -> list[int]:
    """``n`` free loopback ports, no two alike."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class ConsulAgent:
    """``consul agent -dev`` on 127.0.0.1, free ports, a temporary data dir. Use as a context manager too.

    ``datacenter`` names the agent's datacenter (``-datacenter``); ``node`` its node name. ``acl_token``: turn
    ACLs on (default policy deny) with this management token, which the helpers below then send. ``tls_files``
    (CA, certificate, key files): HTTPS on ``https_port`` as well, with client certificates required (the
    helpers keep using plain HTTP).
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, *, datacenter: str = "dc1",
                 node: str = "waypost-test", binary: str | os.PathLike[str] | None = None,
                 ready_timeout: float = 30.0, acl_token: str | None = None,
                 tls_files: tuple[str, str, str] | None = None, dns: bool = False, persistent: bool = False) -> None:
        self.acl_token = acl_token
        # six ports drawn one after another may repeat (a port freed is free again): the agent refuses two roles on
        # one port, so draw until they differ
        ports = _distinct_ports(6)
        #: a server agent keeping its data dir across restarts (not -dev)
        self.persistent = persistent
        #: Consul's DNS interface on this loopback port (UDP and TCP), with ``dns``; -1: off
        self.dns_port = ports[0] if dns else -1
        #: (CA, certificate, key): serve HTTPS too, on ``https_port``, requiring client certificates
        self.tls_files = tls_files
        self.https_port = ports[1] if tls_files else -1
        self._binary = Path(binary) if binary else None
        self._own_dir = base_dir is None
        self.dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="waypost-consul-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.datacenter = datacenter
        self.node = node
        self.ready_timeout = ready_timeout
        self.http_port, self.server_port, self.serf_lan_port, self.serf_wan_port = ports[2:]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "consul.log"
        self.startup_seconds: float | None = None  # of the last start(), until a leader was elected
        self.starts = 0

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = consul_binary()
        return self._binary

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def url(self) -> str:
        """The registry URL for waypost (``consul://127.0.0.1:PORT``)."""
        return f"consul://{self.address}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        mode = ["-server", "-bootstrap-expect=1", "-hcl", "performance { raft_multiplier = 1 }",
                "-hcl", "disable_update_check = true"] if self.persistent else ["-dev"]
        cmd = [
            str(self.binary), "agent", *mode, "-bind=127.0.0.1", "-client=127.0.0.1",
            f"-http-port={self.http_port}", f"-dns-port={self.dns_port}", "-grpc-port=-1",
            f"-server-port={self.server_port}", f"-serf-lan-port={self.serf_lan_port}",
            f"-serf-wan-port={self.serf_wan_port}", f"-data-dir={self.dir / 'data'}",
            f"-datacenter={self.datacenter}", f"-node={self.node}", "-log-level=warn",
            "-hcl", "ports { grpc_tls = -1 }",
        ]
        if self.acl_token:
            tok = json.dumps(self.acl_token)
            cmd += ["-hcl", ('acl { enabled = true default_policy = "deny" enable_token_persistence = false '
                            f"tokens {{ initial_management = {tok} agent = {tok} }} }}")]
        if self.tls_files:
            ca, cert, key = (json.dumps(str(f)) for f in self.tls_files)
            cmd += ["-hcl", (f"ports {{ https = {self.https_port} }} tls {{ https {{ ca_file = {ca} "
                            f"cert_file = {cert} key_file = {key} verify_incoming = true }} }}")]
        return cmd

    def __enter__(self) -> ConsulAgent:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ConsulAgent:
        """Start the agent (same ports as before if it ran already) and wait until it has a leader."""
        if self.running:
            return self
        binary = self.binary  # build (or fail) before starting anything
        if not self.persistent:
            shutil.rmtree(self.dir / "data", ignore_errors=True)  # -dev keeps nothing anyway
        started = time.monotonic()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n===== start {time.strftime('%H:%M:%S')} =====\n".encode())
            logf.flush()
            cmd = self.command()
            cmd[0] = str(binary)
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        proc_reaper.track(self, self.close)  # a test run that forgot close(), or was killed, leaves no agent behind
        try:
            self.wait_ready(self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        self.starts += 1
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"consul exited ({code}) before it was ready; log: {self.tail_log()}")
            try:
                leader = self.get("/v1/status/leader", timeout=2)
                if leader:
                    return
                last = f"leader {leader!r}"
            except (OSError, ConsulApiError) as e:
                last = repr(e)
            time.sleep(0.05)
        raise RuntimeError(f"consul not ready on {self.address} after {timeout} s ({last}); log: {self.tail_log()}")

    def stop(self, timeout: float = 10.0, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with ``kill``: a crash), SIGKILL after ``timeout`` s. The ports stay ours."""
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, timeout, kill=kill)

    def restart(self, down_s: float = 0.0, kill: bool = False) -> None:
        """Stop, stay down ``down_s`` s, start on the same ports; every registration is lost (-dev) or kept
        (``persistent``)."""
        self.stop(kill=kill)
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.stop()
        proc_reaper.untrack(self)
        if self._own_dir and os.environ.get("WAYPOST_CONSUL_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def tail_log(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    # -- plain HTTP API (another client's view) --

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 5.0) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"X-Consul-Token": self.acl_token} if self.acl_token else {}
        req = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def call(self, method: str, path: str, body: Any = None, *, timeout: float = 5.0) -> Any:
        status, raw = self.request(method, path, body, timeout=timeout)
        if status != 200:
            raise ConsulApiError(method, path, status, raw)
        return json.loads(raw) if raw.strip() else None

    def get(self, path: str, *, timeout: float = 5.0) -> Any:
        return self.call("GET", path, timeout=timeout)

    def put(self, path: str, body: Any = None, *, timeout: float = 5.0) -> Any:
        return self.call("PUT", path, body, timeout=timeout)

    def health(self, service: str, *, passing: bool = True, **params: str) -> list[dict[str, Any]]:
        """``/v1/health/service/<name>`` entries (passing only by default)."""
        q = dict(params)
        if passing:
            q["passing"] = "1"
        return self.get(f"/v1/health/service/{urllib.parse.quote(service)}?{urllib.parse.urlencode(q)}")

    def catalog(self, service: str) -> list[dict[str, Any]]:
        return self.get(f"/v1/catalog/service/{urllib.parse.quote(service)}")

    def passing_addresses(self, service: str) -> list[str]:
        return sorted(f"{e['Service']['Address'] or e['Node']['Address']}:{e['Service']['Port']}"
                      for e in self.health(service))

    def locally_passing_addresses(self, service: str) -> list[str]:
        """The instances of ``service`` whose checks pass in the agent's own state. Right after a restart the
        catalog (``passing_addresses``) can still show the state saved before the stop until the agent syncs
        what it restored (a TTL check that expired meanwhile comes back critical); this view does not lag."""
        status, raw = self.request("GET", f"/v1/agent/health/service/name/{urllib.parse.quote(service)}")
        if status not in (200, 429, 503):  # 429: warning, 503: critical somewhere (the body still lists all)
            raise ConsulApiError("GET", f"/v1/agent/health/service/name/{service}", status, raw)
        return sorted(f"{e['Service']['Address']}:{e['Service']['Port']}" for e in json.loads(raw or b"[]")
                      if e.get("AggregatedStatus") == "passing")

    def register(self, name: str, address: str, port: int, *, id: str | None = None, tags: list[str] | None = None,
                 meta: dict[str, str] | None = None, ttl: str | None = None) -> str:
        """Register a service the way any other client would (PUT /v1/agent/service/register)."""
        sid = id or f"{name}-{address}-{port}"
        body: dict[str, Any] = {"ID": sid, "Name": name, "Address": address, "Port": port,
                                "Tags": tags or [], "Meta": meta or {}}
        if ttl is not None:
            body["Check"] = {"CheckID": f"service:{sid}", "TTL": ttl, "Status": "passing"}
        self.put("/v1/agent/service/register", body)
        return sid

    def deregister(self, service_id: str) -> None:
        self.put(f"/v1/agent/service/deregister/{urllib.parse.quote(service_id)}")

    def make_token(self, rules: str, name: str = "waypost-test") -> str:
        """A new ACL token (its SecretID) with a policy of ``rules`` (HCL), e.g.
        ``service_prefix "" { policy = "write" }``. Needs ``acl_token``."""
        self.put("/v1/acl/policy", {"Name": name, "Rules": rules})
        return str(self.put("/v1/acl/token", {"Policies": [{"Name": name}]})["SecretID"])

    def check(self, check_id: str, status: str) -> None:
        """Set a TTL check's status (``pass``, ``warn``, ``fail``)."""
        self.put(f"/v1/agent/check/{status}/{urllib.parse.quote(check_id)}")


# ------------------------------------------------------------------------------------- a wrong server in front


class HealthProxy:
    """An HTTP server on 127.0.0.1 (a thread of this process) standing at an agent's address.

    ``GET /v1/health/service/...`` is answered with ``bodies`` (cycled, status 200, an ``X-Consul-Index``
    of ``index``) while ``mode`` is ``"bad"``; with ``"mix"`` it is forwarded without its blocking
    parameters (so every query answers at once) and ``extra`` entries are appended to the real list; with
    ``"forward"`` it is forwarded as it is. Every other request is always forwarded. ``health_requests``
    counts the health requests seen."""

    def __init__(self, upstream: tuple[str, int], bodies: list[bytes], *, index: int = 7) -> None:
        import http.server
        import threading

        self.upstream = upstream
        self.bodies = list(bodies)
        self.index = index
        self.mode = "bad"
        self.extra: list[Any] = []
        self.health_requests = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client went away meanwhile (a closed channel)
                    self.wfile.write(body)

            def _forward(self, path: str) -> tuple[int, bytes, dict[str, str]]:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                req = urllib.request.Request(f"http://{proxy.upstream[0]}:{proxy.upstream[1]}{path}", data=data,
                                             method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        return resp.status, resp.read(), {k: v for k, v in resp.headers.items()
                                                          if k.lower().startswith("x-consul")}
                except urllib.error.HTTPError as e:
                    return e.code, e.read(), {}
                except OSError as e:
                    return 502, str(e).encode(), {}

            def _handle(self) -> None:
                path = self.path
                if path.startswith("/v1/health/service/") and self.command == "GET":
                    proxy.health_requests += 1
                    mode = proxy.mode
                    if mode == "bad":
                        body = proxy.bodies[(proxy.health_requests - 1) % len(proxy.bodies)]
                        return self._answer(200, body, {"Content-Type": "application/json",
                                                        "X-Consul-Index": str(proxy.index)})
                    if mode == "mix":
                        url = urllib.parse.urlsplit(path)
                        query = [(k, v) for k, v in urllib.parse.parse_qsl(url.query) if k not in ("index", "wait")]
                        status, body, headers = self._forward(f"{url.path}?{urllib.parse.urlencode(query)}")
                        if status == 200:
                            body = json.dumps(json.loads(body) + proxy.extra).encode()
                        return self._answer(status, body, headers)
                self._answer(*self._forward(path))

            do_GET = do_PUT = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="test-consul-health-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


if __name__ == "__main__":  # build (or find) the binary: python -m harness.consul_agent
    print(consul_binary())


# ---- fixtures shared by the Consul test modules (imported there by name) ------------------------------------------


@pytest.fixture(scope="module", name="consul_bin")
def fixture_consul_bin() -> Path:
    """The Consul binary (built once and cached; the module is skipped, saying why, when it cannot be)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return consul_binary()


@pytest.fixture(scope="module", name="shared_agent")
def fixture_shared_agent(consul_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsulAgent]:
    """One agent for the tests of a module that do not disturb it (each uses its own service names)."""
    with ConsulAgent(tmp_path_factory.mktemp("consul-shared"), binary=consul_bin) as agent:
        yield agent


_names = itertools.count()


def unique_name(prefix: str = "svc") -> str:
    """A service name no other test of this process uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"
