"""ZooKeeper test harness: a real ZooKeeper 3.9.5 server (jars from Maven Central, fetched once, cached).

* ``zookeeper_lib()`` fetches ``org.apache.zookeeper:zookeeper:3.9.5`` and its runtime dependencies with the recipe
  of shared/notes/real-registries.md (a pom and ``mvn -q -B dependency:copy-dependencies``) into
  ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/zookeeper-3.9.5/lib``, under a file lock so that concurrent
  test processes fetch it once; bounded by ``$WAYPOST_ZK_FETCH_TIMEOUT`` (default 600 s). The pom adds what the
  server needs at run time although upstream marks it provided (metrics-core, snappy-java) and slf4j-simple (logs
  to the server's log file). ``skip_reason()`` says why the harness cannot run here (no java, no mvn and nothing
  cached): tests call ``pytest.skip(reason)``.
* ``ZkServer``: a standalone server on a free loopback port (``clientPortAddress=127.0.0.1``), its data dir and
  log in a temporary directory; ``start()`` returns once ``srvr`` answers "Zookeeper version" (``ruok`` says imok
  even after a failed start); ``stop()``/``start()``/``restart()`` keep the port and the data dir, so sessions
  and persistent nodes survive a restart as on a real ensemble member. ``tick_time`` is 500 ms by default: the
  server grants session timeouts from 1 s (2 ticks) to ``max_session_timeout`` (30 s), so tests can expire a
  session in a couple of seconds.

Every process here is started by this module and stopped by it by its PID (SIGTERM, SIGKILL after a bound);
``harness/proc_reaper.py`` stops what is left when the test process ends, killed or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from harness import proc_reaper
from harness.go_servers import servers_cache
from waypost.etcd.local import free_port

ZK_VERSION = "3.9.5"
#: cold: ~30 s of downloads through Maven
FETCH_TIMEOUT = float(os.environ.get("WAYPOST_ZK_FETCH_TIMEOUT", "600"))
#: per-test bound once the jars are cached
TEST_TIMEOUT = 60.0

# The recipe of the note: ZooKeeper plus what its server needs at run time (marked provided upstream, the server
# dies without them) and a plain slf4j binding.
POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>waypost.tests</groupId>
  <artifactId>zookeeper-server</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.zookeeper</groupId>
      <artifactId>zookeeper</artifactId>
      <version>3.9.5</version>
      <exclusions>
        <exclusion><groupId>ch.qos.logback</groupId><artifactId>logback-classic</artifactId></exclusion>
        <exclusion><groupId>ch.qos.logback</groupId><artifactId>logback-core</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>io.dropwizard.metrics</groupId>
      <artifactId>metrics-core</artifactId>
      <version>4.1.12.1</version>
    </dependency>
    <dependency>
      <groupId>org.xerial.snappy</groupId>
      <artifactId>snappy-java</artifactId>
      <version>1.1.10.5</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>2.0.13</version>
    </dependency>
  </dependencies>
</project>
"""
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ZkUnavailable(RuntimeError):
    """The harness cannot run on this machine (the message says why): tests skip with it."""


class ZkFetchError(RuntimeError):
    """Fetching the jars failed (a real failure, not a skip)."""


def lib_dir() -> Path:
    return servers_cache() / f"zookeeper-{ZK_VERSION}" / "lib"


def is_fetched() -> bool:
    return (lib_dir().parent / "complete").is_file()


def java_binary() -> str | None:
    return os.environ.get("WAYPOST_JAVA") or shutil.which("java")


_skip: list[str | None] = []


def skip_reason() -> str | None:
    """Why the ZooKeeper harness cannot run here, or None."""
    if not _skip:
        _skip.append(_skip_reason())
    return _skip[0]


def _skip_reason() -> str | None:
    if os.environ.get("WAYPOST_ZK", "1") == "0":
        return "ZooKeeper tests turned off by WAYPOST_ZK=0"
    if java_binary() is None:
        return "no java on PATH (ZooKeeper 3.9.5 needs Java 8+; or set WAYPOST_JAVA)"
    if not is_fetched() and shutil.which("mvn") is None:
        return f"no mvn on PATH to fetch ZooKeeper {ZK_VERSION} from Maven Central (and no cached jars in {lib_dir()})"
    try:
        import kazoo  # noqa: F401
    except ImportError:
        return "kazoo is not installed (pip install 'waypost[zk]')"
    return None


def timeout_mark():
    """pytest-timeout bound for a test whose setup may have to fetch the jars (cold: ~30 s, allow minutes)."""
    import pytest

    return pytest.mark.timeout(TEST_TIMEOUT + (0 if is_fetched() else FETCH_TIMEOUT))


def zookeeper_lib(timeout: float | None = None) -> Path:
    """The directory of ZooKeeper's jars, fetched once (cached; concurrent callers wait for one fetch)."""
    lib = lib_dir()
    home = lib.parent
    if is_fetched():
        return lib
    if shutil.which("mvn") is None:
        raise ZkUnavailable(f"no mvn on PATH to fetch ZooKeeper {ZK_VERSION}")
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the jars
        if is_fetched():
            return lib
        home.mkdir(exist_ok=True)
        shutil.rmtree(lib, ignore_errors=True)
        (home / "pom.xml").write_text(POM)
        log_path = home / "fetch.log"
        limit = FETCH_TIMEOUT if timeout is None else timeout
        started = time.monotonic()
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(
                ["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={lib}",
                 "-DincludeScope=runtime"],
                cwd=home, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc_reaper.wait_group(proc, limit)  # mvn's own process group
            except subprocess.TimeoutExpired:
                raise ZkFetchError(f"fetching ZooKeeper took longer than {limit:.0f} s "
                                   f"(WAYPOST_ZK_FETCH_TIMEOUT); log: {log_path}") from None
            seconds = time.monotonic() - started
        jars = sorted(p.name for p in lib.glob("*.jar")) if lib.is_dir() else []
        if rc != 0 or not any(j.startswith(f"zookeeper-{ZK_VERSION}") for j in jars):
            tail = log_path.read_bytes()[-3000:].decode(errors="replace")
            raise ZkFetchError(f"fetching ZooKeeper failed (exit {rc}, jars {jars}); log {log_path}:\n{tail}")
        (home / "fetch-seconds").write_text(f"{seconds:.1f}\n")
        (home / "complete").write_text("\n".join(jars) + "\n")
    return lib


def four_letter(port: int, word: bytes = b"srvr", host: str = "127.0.0.1", timeout: float = 1.0) -> str:
    """A four-letter-word command's answer ("" when nothing answers)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word)
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZkServer:
    """A standalone ZooKeeper in a temporary directory. ``start()`` returns self; a context manager too."""

    def __init__(self, port: int | None = None, tick_time_ms: int = 500, max_session_timeout_ms: int = 30000,
                 base_dir: str | os.PathLike[str] | None = None, ready_timeout: float = 30.0) -> None:
        self.port = port or free_port()
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.ready_timeout = ready_timeout
        self._own_dir = base_dir is None
        self.dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="waypost-zk-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: seconds from the JVM's launch to ``srvr`` answering, per start
        self.startup_seconds: list[float] = []
        self._log: BinaryIO | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "zookeeper.log"

    def config_text(self) -> str:
        return "\n".join([
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons,wchc",
            "preAllocSize=1024",  # KB: no 64 MB transaction log per test
            "forceSync=no",  # a test server on a shared machine: no fsync per write
            "",
        ])

    def command(self, lib: Path) -> list[str]:
        java = java_binary()
        assert java is not None
        return [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", f"{lib}/*", MAIN_CLASS, str(self.dir / "zoo.cfg")]

    def start(self) -> ZkServer:
        if self.alive:
            return self
        lib = zookeeper_lib()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(exist_ok=True)
        (self.dir / "zoo.cfg").write_text(self.config_text())
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        started = time.monotonic()
        self.proc = subprocess.Popen(self.command(lib), cwd=self.dir, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.starts += 1
        proc_reaper.track(self, self.close)  # a test run that forgot stop(), or was killed, leaves no JVM behind
        deadline = started + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"ZooKeeper exited with code {code} while starting; log:\n{self.log_tail()}")
            if four_letter(self.port).startswith("Zookeeper version"):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ZooKeeper did not answer srvr within {self.ready_timeout:.0f} s; log:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.05)
        self.startup_seconds.append(time.monotonic() - started)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL after ``timeout`` s. The data dir stays (``start()`` again resumes it)."""
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, timeout)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def restart(self) -> ZkServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        proc_reaper.untrack(self)
        if self._own_dir and os.environ.get("WAYPOST_ZK_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ZkServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ZK_VERSION", "ZkFetchError", "ZkServer", "ZkUnavailable", "four_letter", "skip_reason", "timeout_mark",
           "zookeeper_lib"]
