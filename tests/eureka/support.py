"""Eureka test harness: a real Spring Cloud Netflix Eureka server and a stock Spring Cloud Eureka client, both built
once with Maven and cached.

* ``eureka_jars()`` builds the server from examples/eureka-server/ (the very project docs/eureka.md gives users
  for a development Eureka, so the page cannot drift from what the tests run) and the client from
  tests/eureka/servers/client/ (spring-boot-starter-parent 4.0.7, spring-cloud-dependencies 2025.1.4) with
  ``BUILD_COMMAND`` (the documented ``mvn -q -B package -DskipTests``) into
  ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/eureka-<hash of the sources>/``, under a file lock so
  that concurrent test processes build once; bounded by ``$WAYPOST_EUREKA_BUILD_TIMEOUT`` (default 1200 s). Each
  jar is then extracted (Spring Boot's ``-Djarmode=tools extract``) and given a class-data-sharing archive from a
  training run (``-XX:ArchiveClassesAtExit`` with ``spring.context.exit=onRefresh``): the server then answers in
  ~10 s on this busy machine instead of ~45 s. ``skip_reason()`` says why the harness cannot run here (no java, no
  mvn and nothing cached, no aiohttp): tests call ``pytest.skip(reason)``.
* ``EurekaServer``: the server on a free loopback port with the test properties (no self-preservation, eviction
  every second, the read cache refreshed every second); ``start()`` returns once ``GET /eureka/apps`` answers 200;
  ``stop()`` / ``kill()`` / ``start()`` keep the port, and a started server is always empty (Eureka keeps its
  registry in memory only). Small synchronous helpers on its REST API (stdlib urllib only, no waypost code) for
  the tests' "another client" view.
* ``SpringClient``: the stock Spring client application: it registers itself (``gRPC_port`` metadata) and prints
  once a second, as one JSON line per watched app, what Spring's ``DiscoveryClient`` sees.

Every process here is started by this module and stopped by it by its PID (SIGTERM, SIGKILL after a bound);
``harness/proc_reaper.py`` stops what is left when the test process ends, killed or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

from harness import proc_reaper
from harness.go_servers import servers_cache
from waypost.etcd.local import free_port

ROOT = Path(__file__).resolve().parents[2]
#: the Maven project of each application: the server is the development Eureka of docs/eureka.md
SOURCES = {"server": ROOT / "examples" / "eureka-server",
           "client": Path(__file__).resolve().parent / "servers" / "client"}
#: how each project is built: the command docs/eureka.md gives users (tests/eureka/test_eureka_docs.py checks)
BUILD_COMMAND = ["mvn", "-q", "-B", "package", "-DskipTests"]
BUILD_TIMEOUT = float(os.environ.get("WAYPOST_EUREKA_BUILD_TIMEOUT", "1200"))
#: per-test bound once the jars exist (a JVM start is ~10-20 s on a busy machine)
TEST_TIMEOUT = 150.0
JVM_FLAGS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-Xlog:cds=off",
             "-Xlog:cds+dynamic=off"]
#: the server's test settings (see server/src/main/resources/application.properties for the rest)
SERVER_PROPERTIES = {
    "eureka.server.enable-self-preservation": "false",
    "eureka.server.eviction-interval-timer-in-ms": "1000",
    "eureka.server.response-cache-update-interval-ms": "1000",
}


class EurekaUnavailable(RuntimeError):
    """The harness cannot run on this machine (the message says why): tests skip with it."""


class EurekaBuildError(RuntimeError):
    """Building the test applications failed (a real failure, not a skip)."""


def java_binary() -> str | None:
    return os.environ.get("WAYPOST_JAVA") or shutil.which("java")


def _sources_hash() -> str:
    h = hashlib.sha256()
    for name, root in sorted(SOURCES.items()):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "target" not in p.parts):
            h.update(f"{name}/{path.relative_to(root)}".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def home() -> Path:
    return servers_cache() / f"eureka-{_sources_hash()}"


def is_built() -> bool:
    return (home() / "complete").is_file()


_skip: list[str | None] = []


def skip_reason() -> str | None:
    """Why the Eureka harness cannot run here, or None."""
    if not _skip:
        _skip.append(_skip_reason())
    return _skip[0]


def _skip_reason() -> str | None:
    if os.environ.get("WAYPOST_EUREKA", "1") == "0":
        return "Eureka tests turned off by WAYPOST_EUREKA=0"
    if java_binary() is None:
        return "no java on PATH (Spring Boot 4 needs Java 17+; or set WAYPOST_JAVA)"
    if not is_built() and shutil.which("mvn") is None:
        return f"no mvn on PATH to build the Eureka test applications (and nothing cached in {home()})"
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return "aiohttp is not installed (pip install 'waypost[eureka]')"
    return None


def timeout_mark() -> Any:
    """pytest-timeout bound for a test whose setup may have to build the jars (cold: minutes)."""
    import pytest

    return pytest.mark.timeout(TEST_TIMEOUT + (0 if is_built() else BUILD_TIMEOUT))


def _run(cmd: list[str], cwd: Path, log_path: Path, limit: float, what: str) -> None:
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc_reaper.wait_group(proc, limit)
        except subprocess.TimeoutExpired:
            raise EurekaBuildError(f"{what} took longer than {limit:.0f} s; log: {log_path}") from None
    if rc != 0:
        tail = log_path.read_bytes()[-3000:].decode(errors="replace")
        raise EurekaBuildError(f"{what} failed (exit {rc}); log {log_path}:\n{tail}")


def eureka_jars(timeout: float | None = None) -> dict[str, Path]:
    """``{"server": jar, "client": jar}`` (extracted, each with its CDS archive beside it), built once."""
    root = home()
    jars = {name: root / name / "app" / f"eureka-{name}.jar" for name in ("server", "client")}
    if is_built():
        return jars
    if shutil.which("mvn") is None:
        raise EurekaUnavailable("no mvn on PATH to build the Eureka test applications")
    java = java_binary()
    assert java is not None
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the jars
        if is_built():
            return jars
        started = time.monotonic()
        limit = BUILD_TIMEOUT if timeout is None else timeout
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        log_path = root / "build.log"
        for name, jar in jars.items():
            src = root / name / "src"
            shutil.copytree(SOURCES[name], src, ignore=shutil.ignore_patterns("target"))
            left = limit - (time.monotonic() - started)
            _run(BUILD_COMMAND, src, log_path, left, f"building the Eureka {name}")
            _run([java, "-Djarmode=tools", "-jar", str(src / "target" / f"eureka-{name}.jar"), "extract",
                  "--destination", str(jar.parent)], root, log_path, 120, f"extracting the Eureka {name}")
            # the training run: start the application context, then exit, writing the classes it loaded
            training = [java, *JVM_FLAGS, f"-XX:ArchiveClassesAtExit={jar.parent / 'app.jsa'}",
                        "-Dspring.context.exit=onRefresh", "-jar", str(jar), f"--server.port={free_port()}",
                        f"--eureka.client.service-url.defaultZone=http://127.0.0.1:{free_port()}/eureka/"]
            _run(training, root, log_path, 300, f"the CDS training run of the Eureka {name}")
            shutil.rmtree(src / "target", ignore_errors=True)
        (root / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
        (root / "complete").write_text("\n".join(str(j) for j in jars.values()) + "\n")
    return jars


def _java_command(jar: Path, args: list[str]) -> list[str]:
    java = java_binary()
    assert java is not None
    cds = jar.parent / "app.jsa"
    share = [f"-XX:SharedArchiveFile={cds}"] if cds.is_file() else []
    return [java, *JVM_FLAGS, *share, "-jar", str(jar), *args]


class EurekaServer:
    """A Spring Cloud Eureka server on a free loopback port. ``start()`` returns self; a context manager too."""

    def __init__(self, port: int | None = None, ready_timeout: float = 120.0,
                 properties: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self.properties = {**SERVER_PROPERTIES, **(properties or {})}
        self.dir = Path(tempfile.mkdtemp(prefix="waypost-eureka-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: seconds from the JVM's launch to ``/eureka/apps`` answering, per start
        self.startup_seconds: list[float] = []
        self._log: BinaryIO | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The registry URL (``eureka://127.0.0.1:PORT``)."""
        return f"eureka://{self.address}"

    @property
    def base(self) -> str:
        return f"http://{self.address}/eureka"

    @property
    def log_path(self) -> Path:
        return self.dir / "eureka.log"

    def target(self, app: str, **options: str) -> str:
        query = urllib.parse.urlencode(options)
        return f"eureka://{self.address}/{app}" + (f"?{query}" if query else "")

    def start(self) -> EurekaServer:
        if self.alive:
            return self
        jar = eureka_jars()["server"]
        args = [f"--server.port={self.port}", *(f"--{k}={v}" for k, v in self.properties.items())]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        started = time.monotonic()
        self.proc = subprocess.Popen(_java_command(jar, args), cwd=self.dir, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.starts += 1
        proc_reaper.track(self, self.close)
        deadline = started + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"Eureka exited with code {code} while starting; log:\n{self.log_tail()}")
            if self.answers():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Eureka did not answer /eureka/apps within {self.ready_timeout:.0f} s; log:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)
        self._wait_open_for_registrations(deadline)
        self.startup_seconds.append(time.monotonic() - started)
        return self

    def _wait_open_for_registrations(self, deadline: float) -> None:
        """Until a registration is readable through ``/apps`` (a probe instance, removed after): a JVM that has
        just begun answering can still be opening its registry and read cache, and a loaded machine stretches
        that past what a test waits for its first registration."""
        app, probe = f"waypost-ready-{os.getpid()}", f"probe-{self.starts}"
        while time.monotonic() < deadline:
            try:
                if self.register(app, probe, 9, ttl=30) == 204 and self.listed(app):
                    self.delete(app, probe)
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Eureka did not show a registration within {self.ready_timeout:.0f} s; log:\n"
                           f"{self.log_tail()}")

    def answers(self) -> bool:
        try:
            self.get("/apps", timeout=1.0)
        except (OSError, ValueError):
            return False
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM by PID, SIGKILL after ``timeout`` s (its registry is gone: Eureka keeps it in memory)."""
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, timeout)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL by PID: a crash."""
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, 10, kill=True)

    def restart(self) -> EurekaServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        proc_reaper.untrack(self)
        if os.environ.get("WAYPOST_EUREKA_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EurekaServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the REST API, synchronously (the tests' view from outside waypost) ------------------------------

    def request(self, method: str, path: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Accept": "application/json", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as e:
            return e.code, None

    def get(self, path: str, timeout: float = 5.0) -> Any:
        status, body = self.request("GET", path, timeout=timeout)
        if status != 200:
            raise ValueError(f"GET {path}: HTTP {status}")
        return body

    def instances(self, app: str) -> list[dict[str, Any]]:
        """The instances of ``app`` as the server holds them (any status); [] for an unknown app."""
        status, body = self.request("GET", f"/apps/{app.upper()}")
        if status == 404:
            return []
        inst = body["application"].get("instance", [])
        return inst if isinstance(inst, list) else [inst]

    def listed(self, app: str) -> dict[str, str]:
        """instanceId -> status of ``app`` in the full registry (``GET /apps``: what a fetching client reads,
        through the server's read cache, which shows a change within ``response-cache-update-interval-ms``)."""
        apps = self.get("/apps")["applications"].get("application", [])
        for a in apps if isinstance(apps, list) else [apps]:
            if a["name"] == app.upper():
                inst = a.get("instance", [])
                return {i["instanceId"]: i["status"] for i in (inst if isinstance(inst, list) else [inst])}
        return {}

    def statuses(self, app: str) -> dict[str, str]:
        """instanceId -> status of ``app``'s instances."""
        return {i["instanceId"]: i["status"] for i in self.instances(app)}

    def register(self, app: str, instance_id: str, port: int, *, status: str = "UP", ttl: int = 30,
                 metadata: dict[str, str] | None = None, host: str = "127.0.0.1") -> int:
        """Register an instance as another Eureka client would (``POST /apps/APP``); the HTTP status."""
        instance = {
            "instanceId": instance_id, "hostName": host, "app": app.upper(), "ipAddr": host, "status": status,
            "port": {"$": port, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
            "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
            "leaseInfo": {"renewalIntervalInSecs": max(1, ttl // 3), "durationInSecs": ttl},
            "metadata": metadata or {}, "vipAddress": app.lower(),
        }
        return self.request("POST", f"/apps/{app.upper()}", {"instance": instance})[0]

    def set_status(self, app: str, instance_id: str, value: str) -> int:
        return self.request("PUT", f"/apps/{app.upper()}/{instance_id}/status?value={value}")[0]

    def clear_status(self, app: str, instance_id: str) -> int:
        return self.request("DELETE", f"/apps/{app.upper()}/{instance_id}/status?value=UP")[0]

    def delete(self, app: str, instance_id: str) -> int:
        return self.request("DELETE", f"/apps/{app.upper()}/{instance_id}")[0]


class SpringClient:
    """The stock Spring Cloud Eureka client application (tests/eureka/servers/client): registers ``app`` with
    ``gRPC_port`` metadata and prints what Spring's DiscoveryClient sees of ``watch`` apps (``seen``)."""

    def __init__(self, server: EurekaServer, app: str, grpc_port: int, watch: tuple[str, ...] = (),
                 http_port: int = 8080, ready_timeout: float = 120.0) -> None:
        self.server = server
        self.app = app
        self.grpc_port = grpc_port
        self.watch = watch
        self.http_port = http_port
        self.ready_timeout = ready_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="waypost-eureka-client-"))
        self.proc: subprocess.Popen[bytes] | None = None
        #: app -> the instances Spring saw last (dicts: host, port, instanceId, metadata)
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def instance_id(self) -> str:
        return f"127.0.0.1:{self.app.lower()}:{self.http_port}"

    def start(self) -> SpringClient:
        jar = eureka_jars()["client"]
        args = [f"--spring.application.name={self.app}",
                f"--eureka.client.service-url.defaultZone={self.server.base}/",
                f"--eureka.instance.metadata-map.gRPC_port={self.grpc_port}",
                f"--eureka.instance.non-secure-port={self.http_port}",
                f"--eureka.instance.instance-id={self.instance_id}",
                f"--watch.apps={','.join(self.watch)}"]
        self.proc = subprocess.Popen(_java_command(jar, args), cwd=self.dir, stdout=subprocess.PIPE,
                                     stderr=open(self.dir / "stderr.log", "wb"),  # noqa: SIM115 (the child owns it)
                                     stdin=subprocess.DEVNULL)
        proc_reaper.track(self, self.close)
        self._reader = threading.Thread(target=self._read, name="spring-client-stdout", daemon=True)
        self._reader.start()
        if not self._ready.wait(self.ready_timeout) or self.proc.poll() is not None:
            self.close()
            raise RuntimeError(f"the Spring Eureka client did not start within {self.ready_timeout:.0f} s")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                doc = json.loads(raw)
            except ValueError:
                continue  # Spring's own log lines
            if doc.get("ready"):
                self._ready.set()
            elif "app" in doc:
                with self._lock:
                    self.seen[doc["app"]] = doc["instances"]
        self._ready.set()

    def instances(self, app: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.seen.get(app, []))

    def close(self) -> None:
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, 20)
        proc_reaper.untrack(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SpringClient:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()




_shared: list[EurekaServer] = []
_shared_lock = threading.Lock()


def shared_server() -> EurekaServer:
    """One Eureka server for every test of this process that does not stop it (each uses its own app names):
    a JVM start is the slow part of these tests. Stopped when the process ends (``proc_reaper``)."""
    with _shared_lock:
        if not _shared or not _shared[0].alive:
            _shared[:] = [EurekaServer().start()]
        return _shared[0]


_names = iter(range(1, 1 << 30))


def unique_app(prefix: str = "app") -> str:
    """An application name no other test of this process uses (lower case: Eureka upper-cases it)."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


__all__ = ["BUILD_COMMAND", "SOURCES", "EurekaBuildError", "EurekaServer", "EurekaUnavailable", "SpringClient",
           "eureka_jars", "shared_server", "skip_reason", "timeout_mark", "unique_app"]
