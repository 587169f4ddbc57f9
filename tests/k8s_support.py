"""Kubernetes test harness: a real kube-apiserver (built from source once, cached) over a real etcd.

Pieces:

* ``apiserver_binary()`` builds kube-apiserver v1.36.3 with the recipe of shared/notes/real-registries.md into
  ``${WAYPOST_SERVERS_CACHE:-~/.cache/waypost-servers}/kube-apiserver-v1.36.3-<go version hash>/`` (the build
  log beside the binary), under a file lock so that concurrent test processes build it once. A cold build takes
  minutes on 2 cores (about 7); a warm one reuses Go's build cache and only links again. ``skip_reason()`` says why
  the harness cannot run here (no Go, no ``unshare -n``, ...): tests call ``pytest.skip(reason)``.
* ``KubeCluster``: etcd (``LocalEtcd``) + kube-apiserver on free ports in a temporary directory, with token and
  client-certificate authentication, RBAC, small synchronous REST helpers (stdlib only), kubeconfig writing,
  apiserver stop/start/restart on the same port, and ``force_watch_gone()`` (a watch resumed from an older
  resourceVersion then gets 410 Gone).
* ``NetnsHost``: runs ``tests/netns_host.py`` inside a private network namespace (Kubernetes refuses loopback
  addresses in EndpointSlices, so pods get 10.77.0.2-9 on the namespace's own lo) and runs scenarios of
  ``tests/k8s_scenarios.py`` there, one at a time, each bounded.

apiserver flags (see ``KubeCluster.apiserver_command``), and why:

* ``--watch-cache=false`` (default here, ``watch_cache=True`` to keep the cache): watches are served straight
  from etcd, so a watch resumed from an old resourceVersion works for as long as etcd has not compacted that
  revision and gets 410 once it has -- deterministic. With the watch cache on, the cache (re)initialises from a
  LIST at apiserver start and answers 410 for any resourceVersion older than that, i.e. a restart of the apiserver
  alone may already turn a resume into 410 (as on real clusters), and bookmarks are only sent with the cache.
* ``--etcd-compaction-interval=0``: the apiserver never compacts etcd by itself (default every 5 min), so 410s
  happen only when a test asks for them (``force_watch_gone``).
* ``--endpoint-reconciler-type=none``: the apiserver does not maintain the ``default/kubernetes`` Endpoints
  (its advertise address is loopback, which Endpoints refuse anyway): no background writes, no log noise.
* ``--authorization-mode=RBAC``: "testtoken" (user admin, group system:masters) may do anything, "readertoken"
  (user reader) only what ``grant()`` allows -- for permission-error tests.
* ``--client-ca-file``: a CA generated here with openssl; ``write_kubeconfig(client_cert=True)`` uses a client
  certificate CN=admin O=system:masters signed by it.
* ``--enable-priority-and-fairness=false``, ``--profiling=false``: less background work on a small machine.

Every process here is started by this module and stopped by it by its PID (SIGTERM, SIGKILL after a bound).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import logging
import os
import queue
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.go_servers import BuildError, GoServer, Unavailable
from waypost.etcd.local import EtcdNotFound, LocalEtcd, find_binary, free_port

log = logging.getLogger("tests.k8s_support")

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = "v1.36.3"
#: per-test bound once the binary exists
TEST_TIMEOUT = 240.0

ADMIN_TOKEN = "testtoken"
READER_TOKEN = "readertoken"
#: the addresses NetnsHost puts on the private namespace's lo (never use them outside such a namespace)
POD_ADDRESSES = tuple(f"10.77.0.{i}" for i in range(2, 10))

# The recipe, byte for byte the commands of the note (and of the first build's build.sh): Go's build cache keys on
# them, so a second build in another directory only links again.
BUILD_SCRIPT = """set -e
go mod download -json k8s.io/kubernetes@v1.36.3 > dl.json
GM=$(python3 -c 'import json; print(json.load(open("dl.json"))["GoMod"])')
{ printf 'module scratch/k8sbuild\\n\\ngo 1.26.0\\n\\nrequire k8s.io/kubernetes v1.36.3\\n\\nreplace (\\n'
  sed -n '/^replace/,/^)/p' "$GM" | grep '=>' | awk '{print "\\t"$1" => "$1" v0.36.3"}'; printf ')\\n'; } > go.mod
GOFLAGS=-mod=mod go get k8s.io/kubernetes/cmd/kube-apiserver@v1.36.3
GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
"""


K8sUnavailable = Unavailable  # the harness cannot run on this machine (the message says why): tests skip with it
K8sBuildError = BuildError  # building kube-apiserver failed (a real failure, not a skip)


class KubeApiError(RuntimeError):
    """A REST call answered with an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.method, self.path, self.status = method, path, status
        try:
            self.body: Any = json.loads(body)
        except ValueError:
            self.body = body.decode(errors="replace")
        msg = self.body.get("message") if isinstance(self.body, dict) else self.body
        super().__init__(f"{method} {path} -> HTTP {status}: {msg}")


# --------------------------------------------------------------------------------------------------- toolchain

APISERVER = GoServer("kube-apiserver", K8S_VERSION, BUILD_SCRIPT, env_binary="WAYPOST_KUBE_APISERVER",
                     timeout_env="WAYPOST_K8S_BUILD_TIMEOUT", default_timeout=1800.0, min_go=(1, 26))

_skip_cache: dict[bool, str | None] = {}


def skip_reason(netns: bool = True) -> str | None:
    """Why the Kubernetes harness cannot run here, or None. ``netns``: also needs ``unshare -n`` and ``ip``."""
    if netns not in _skip_cache:
        _skip_cache[netns] = _skip_reason(netns)
    return _skip_cache[netns]


def _skip_reason(netns: bool) -> str | None:
    if os.environ.get("WAYPOST_K8S", "1") == "0":
        return "Kubernetes tests turned off by WAYPOST_K8S=0"
    why = APISERVER.skip_reason()
    if why is not None:
        return why
    if shutil.which("openssl") is None:
        return "openssl missing (needed for the test certificates)"
    try:
        find_binary("etcd")
        find_binary("etcdctl")
    except EtcdNotFound as e:
        return str(e)
    if netns:
        if shutil.which("ip") is None:
            return "ip (iproute2) missing"
        if shutil.which("unshare") is None:
            return "unshare (util-linux) missing"
        try:
            p = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True,
                               text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return f"unshare -n is not permitted here: {e}"
        if p.returncode != 0:
            return f"unshare -n is not permitted here: {(p.stderr or p.stdout).strip()[:300]}"
    return None


def is_built() -> bool:
    return APISERVER.is_built()


def timeout_mark() -> Any:
    """pytest-timeout bound for a test whose setup may have to build kube-apiserver (cold: minutes)."""
    import pytest

    return pytest.mark.timeout(TEST_TIMEOUT + (0 if is_built() else APISERVER.build_timeout()))


def apiserver_binary(timeout: float | None = None) -> Path:
    """The kube-apiserver binary, built once per Go toolchain (tests/go_servers.py). Raises ``K8sUnavailable``
    when it cannot be built here and ``K8sBuildError`` when the build fails or exceeds its timeout
    (``$WAYPOST_K8S_BUILD_TIMEOUT``, 1800 s)."""
    return APISERVER.binary(timeout)


# ------------------------------------------------------------------------------------------------- processes


def _openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {p.stderr.strip()}")


def _stop_proc(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


_running: weakref.WeakSet[KubeCluster] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # a test run that forgot stop() does not leave an apiserver behind
    for c in list(_running):
        with contextlib.suppress(Exception):
            c.stop()


class KubeCluster:
    """etcd + kube-apiserver in a temporary directory. ``start()`` returns self; use as a context manager too.

    ``bind_host`` is where the apiserver listens (and what it advertises unless ``advertise_address``);
    etcd always listens on 127.0.0.1. ``watch_cache`` False (default) serves watches from etcd (see the module
    docstring for why). ``extra_args`` are appended to the apiserver's command line.
    """

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        advertise_address: str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        watch_cache: bool = False,
        authorization_mode: str = "RBAC",
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = 90.0,
    ) -> None:
        self.bind_host = bind_host
        self.advertise_address = advertise_address or bind_host
        self._binary = Path(binary) if binary else None
        self.watch_cache = watch_cache
        self.authorization_mode = authorization_mode
        self.extra_args = list(extra_args)
        self.port = port or 0
        self.ready_timeout = ready_timeout
        self._own_dir = base_dir is None
        self.dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="waypost-k8s-"))
        self.etcd: LocalEtcd | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "apiserver.log"
        self.startup_seconds: float | None = None  # of the last start_apiserver(), until /readyz said ok

    # -- lifecycle --

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = apiserver_binary()
        return self._binary

    @property
    def base_url(self) -> str:
        host = f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host
        return f"https://{host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The apiserver's self-signed serving certificate (its CA is in the same file), written in --cert-dir
        at first start and reused on restarts."""
        return self.dir / "certs" / "apiserver.crt"

    @property
    def client_ca_file(self) -> Path:
        return self.dir / "pki" / "client-ca.crt"

    @property
    def client_cert_file(self) -> Path:
        return self.dir / "pki" / "admin.crt"

    @property
    def client_key_file(self) -> Path:
        return self.dir / "pki" / "admin.key"

    def __enter__(self) -> KubeCluster:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _prepare(self) -> None:
        pki = self.dir / "pki"
        if (pki / "admin.crt").exists():
            return
        pki.mkdir(parents=True, exist_ok=True)
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-x509", *ec, "-keyout", "client-ca.key", "-out", "client-ca.crt", "-days", "3650",
                 "-subj", "/CN=waypost-test-client-ca", cwd=pki)
        _openssl("req", *ec, "-keyout", "admin.key", "-out", "admin.csr", "-subj", "/O=system:masters/CN=admin",
                 cwd=pki)
        (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n")
        _openssl("x509", "-req", "-in", "admin.csr", "-CA", "client-ca.crt", "-CAkey", "client-ca.key",
                 "-CAcreateserial", "-out", "admin.crt", "-days", "3650", "-extfile", "client.ext", cwd=pki)
        (pki / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
                                        f"{READER_TOKEN},reader,reader\n")

    def apiserver_command(self) -> list[str]:
        assert self.etcd is not None
        pki = self.dir / "pki"
        return [
            str(self.binary),
            f"--etcd-servers={self.etcd.members[0].client_url}",
            f"--bind-address={self.bind_host}",
            f"--advertise-address={self.advertise_address}",
            f"--secure-port={self.port}",
            f"--cert-dir={self.dir / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--token-auth-file={pki / 'tokens.csv'}",
            f"--client-ca-file={pki / 'client-ca.crt'}",
            f"--authorization-mode={self.authorization_mode}",
            "--disable-admission-plugins=ServiceAccount",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            "--etcd-compaction-interval=0",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            *self.extra_args,
        ]

    def start(self) -> KubeCluster:
        """Start etcd and the apiserver; returns once /readyz answers ok (bounded by ``ready_timeout``)."""
        _ = self.binary  # build (or fail) before starting anything
        self._prepare()
        if self.etcd is None:
            self.etcd = LocalEtcd(1, base_dir=self.dir / "etcd")
        self.etcd.start()
        _running.add(self)
        try:
            self.start_apiserver()
        except BaseException:
            self.stop()
            raise
        return self

    def start_apiserver(self, timeout: float | None = None) -> None:
        """Start the apiserver (on the same port as before, if it ran already) and wait until it is ready."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if not self.port:
            self.port = free_port(self.bind_host)
        started = time.monotonic()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n===== start {time.strftime('%H:%M:%S')} =====\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(self.apiserver_command(), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready(self.ready_timeout if timeout is None else timeout)
        self.startup_seconds = time.monotonic() - started

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"kube-apiserver exited ({code}) before it was ready; log: {self.tail_log()}")
            if self.ca_file.exists():
                try:
                    status, body = self.request("GET", "/readyz", timeout=5)
                    if status == 200 and body.strip() == b"ok":
                        return
                    last = f"HTTP {status}: {body[-300:]!r}"
                except (OSError, http.client.HTTPException, ssl.SSLError) as e:
                    last = repr(e)
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready on {self.base_url} after {timeout} s ({last}); "
                           f"log: {self.tail_log()}")

    @property
    def apiserver_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop_apiserver(self, timeout: float = 20.0, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL with ``kill``: a crash), SIGKILL after ``timeout`` s. The port stays reserved
        for start_apiserver() (nobody else should take it meanwhile)."""
        if kill and self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        _stop_proc(self.proc, timeout)
        self.proc = None

    def restart_apiserver(self, down_s: float = 0, kill: bool = False) -> None:
        """Stop the apiserver, stay down ``down_s`` s, start it on the same port and wait until ready."""
        self.stop_apiserver(kill=kill)
        if down_s > 0:
            time.sleep(down_s)
        self.start_apiserver()

    def stop(self) -> None:
        """Stop the apiserver and etcd; the temporary directory goes too (unless WAYPOST_K8S_KEEP=1)."""
        self.stop_apiserver()
        if self.etcd is not None:
            self.etcd.close()
            self.etcd = None
        _running.discard(self)
        if self._own_dir and os.environ.get("WAYPOST_K8S_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def tail_log(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    # -- etcd --

    def etcd_revision(self) -> int:
        assert self.etcd is not None
        return self.etcd.revision()

    def force_watch_gone(self) -> int:
        """Make every resourceVersion obtained before this call too old to resume a watch from.

        Bumps etcd's revision twice (a key outside the apiserver's /registry prefix) and compacts etcd at the
        new revision (``etcdctl compaction --physical``); with ``watch_cache`` it also restarts the apiserver
        (the cache would otherwise still serve the compacted events). Returns the compacted revision.

        Verified with v1.36.3 and --watch-cache=false (test_k8s_harness): ``GET .../endpointslices?watch=1&
        resourceVersion=OLD`` then answers HTTP 200 whose first and only line is an ERROR event, ``{"type":
        "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "The resourceVersion
        for the provided watch is too old."}}``, and the stream ends; never an HTTP 410. A watch from a
        resourceVersion obtained after the call works normally.
        """
        assert self.etcd is not None
        for i in range(2):
            self.etcd.etcdctl("put", "/waypost-test/bump", str(i))
        rev = self.etcd.compact()
        if self.watch_cache:
            self.restart_apiserver()
        return rev

    # -- REST --

    def ssl_context(self, client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if client_cert:
            ctx.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return ctx

    def request(self, method: str, path: str, body: Any = None, token: str | None = ADMIN_TOKEN,
                timeout: float = 15.0, content_type: str = "application/json",
                client_cert: bool = False) -> tuple[int, bytes]:
        """One HTTPS request (a new connection); returns (status, body). ``body``: a dict (sent as JSON) or
        bytes. ``token`` None sends no Authorization header."""
        conn = http.client.HTTPSConnection(self.bind_host, self.port, timeout=timeout,
                                           context=self.ssl_context(client_cert))
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def api(self, method: str, path: str, body: Any = None, ok: Iterable[int] = (200, 201, 202),
            token: str | None = ADMIN_TOKEN, **kw: Any) -> Any:
        """A JSON REST call; raises KubeApiError unless the status is in ``ok``."""
        status, data = self.request(method, path, body, token=token, **kw)
        if status not in tuple(ok):
            raise KubeApiError(method, path, status, data)
        return json.loads(data) if data else None

    def get(self, path: str, token: str | None = ADMIN_TOKEN) -> Any:
        return self.api("GET", path, token=token)

    def create_namespace(self, ns: str) -> dict[str, Any]:
        """Create a namespace (an existing one is fine). There is no namespace controller: deleting one would
        leave it Terminating forever, so tests use fresh names instead."""
        try:
            return self.api("POST", "/api/v1/namespaces",
                            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        except KubeApiError as e:
            if e.status == 409:
                return self.get(f"/api/v1/namespaces/{ns}")
            raise

    def create_service(self, ns: str, name: str, ports: Sequence[tuple[str, int]] = (("grpc", 50051),),
                       selector: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A ClusterIP Service (an existing one is returned as is). Without a selector nothing manages its
        endpoints: tests write the EndpointSlices themselves (put_slice)."""
        spec: dict[str, Any] = {"type": "ClusterIP",
                                "ports": [{"name": n, "port": p, "protocol": "TCP", "targetPort": p}
                                          for n, p in ports]}
        if selector:
            spec["selector"] = dict(selector)
        obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec}
        try:
            return self.api("POST", f"/api/v1/namespaces/{ns}/services", obj)
        except KubeApiError as e:
            if e.status == 409:
                return self.get(f"/api/v1/namespaces/{ns}/services/{name}")
            raise

    def delete_service(self, ns: str, name: str) -> None:
        self.api("DELETE", f"/api/v1/namespaces/{ns}/services/{name}", ok=(200, 202, 404))

    @staticmethod
    def slice_path(ns: str, name: str | None = None) -> str:
        base = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
        return f"{base}/{name}" if name else base

    def put_slice(
        self,
        ns: str,
        name: str,
        service: str,
        address_type: str = "IPv4",
        endpoints: Sequence[Mapping[str, Any] | str] = (),
        ports: Sequence[Mapping[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """Create or replace the EndpointSlice ``ns/name`` of ``service``; returns its new resourceVersion.

        ``endpoints``: dicts as in the API (``{"addresses": [...], "conditions": {"ready": True}, ...}``) or bare
        address strings (ready). ``ports`` default ``[{"name": "grpc", "port": 50051, "protocol": "TCP"}]``.
        """
        eps = [{"addresses": [e], "conditions": {"ready": True}} if isinstance(e, str) else dict(e)
               for e in endpoints]
        obj = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns, "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "waypost-tests",
                **(labels or {})}, **({"annotations": dict(annotations)} if annotations else {})},
            "addressType": address_type,
            "endpoints": eps,
            "ports": [dict(p) for p in (ports if ports is not None
                                         else [{"name": "grpc", "port": 50051, "protocol": "TCP"}])],
        }
        try:
            out = self.api("POST", self.slice_path(ns), obj)
        except KubeApiError as e:
            if e.status != 409:
                raise
            out = self.api("PUT", self.slice_path(ns, name), obj)  # unconditional update (no resourceVersion)
        return str(out["metadata"]["resourceVersion"])

    def delete_slice(self, ns: str, name: str, missing_ok: bool = False) -> None:
        self.api("DELETE", self.slice_path(ns, name), ok=(200, 202, 404) if missing_ok else (200, 202))

    def list_slices(self, ns: str, service: str | None = None) -> dict[str, Any]:
        """The EndpointSliceList (``metadata.resourceVersion`` is the list's), optionally of one service."""
        q = f"?labelSelector=kubernetes.io%2Fservice-name%3D{service}" if service else ""
        return self.get(self.slice_path(ns) + q)

    def grant(self, ns: str, user: str = "reader", resources: Sequence[str] = ("endpointslices",),
              verbs: Sequence[str] = ("get", "list", "watch"), api_group: str = "discovery.k8s.io") -> None:
        """RBAC: let ``user`` do ``verbs`` on ``resources`` in ``ns`` (a Role and a RoleBinding named after
        the user). Takes effect within a moment (RBAC's informers)."""
        role: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": f"waypost-{user}", "namespace": ns},
                "rules": [{"apiGroups": [api_group], "resources": list(resources), "verbs": list(verbs)}]}
        binding: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": f"waypost-{user}", "namespace": ns},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"waypost-{user}"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
        for kind, obj in (("roles", role), ("rolebindings", binding)):
            base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{kind}"
            try:
                self.api("POST", base, obj)
            except KubeApiError as e:
                if e.status != 409:
                    raise
                self.api("PUT", f"{base}/{obj['metadata']['name']}", obj)

    def raw_watch(self, path: str, resource_version: str | int | None = None, max_events: int = 1,
                  timeout: float = 10.0, token: str | None = ADMIN_TOKEN,
                  params: str = "") -> tuple[int, list[dict[str, Any]]]:
        """``GET path?watch=1&resourceVersion=RV``: (HTTP status, events). Reads until ``max_events`` events,
        the end of the stream, or ``timeout`` s without a line. A non-200 answer gives its body (a Status) as
        the single item."""
        q = "watch=1&allowWatchBookmarks=false"
        if resource_version is not None:
            q += f"&resourceVersion={resource_version}"
        if params:
            q += "&" + params
        conn = http.client.HTTPSConnection(self.bind_host, self.port, timeout=timeout, context=self.ssl_context())
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request("GET", f"{path}{'&' if '?' in path else '?'}{q}", headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                data = resp.read()
                try:
                    return resp.status, [json.loads(data)]
                except ValueError:
                    return resp.status, [{"raw": data.decode(errors="replace")}]
            events: list[dict[str, Any]] = []
            while len(events) < max_events:
                try:
                    line = resp.readline()
                except (TimeoutError, OSError):
                    break
                if not line:
                    break
                if line.strip():
                    events.append(json.loads(line))
            return resp.status, events
        finally:
            conn.close()

    # -- kubeconfig --

    def write_kubeconfig(
        self,
        path: str | os.PathLike[str],
        token: str | None = ADMIN_TOKEN,
        namespace: str | None = None,
        context: str = "test",
        extra_contexts: Mapping[str, Mapping[str, Any]] | None = None,
        client_cert: bool = False,
        inline: bool = False,
        server: str | None = None,
    ) -> Path:
        """Write a kubeconfig whose current-context is ``context``; returns the path.

        Each context has a user of its own (``<context>-user``) with ``token`` or, with ``client_cert``, the
        admin client certificate (client-certificate/client-key paths; ``inline`` embeds them, and the CA, as
        ``*-data``). ``extra_contexts``: {name: {"token"|"namespace"|"client_cert"|"server": ...}} for more
        contexts; a ``server`` of their own gets a cluster of their own. Written as YAML (PyYAML) or else JSON,
        which is YAML too.
        """
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        clusters: list[dict[str, Any]] = []
        users: list[dict[str, Any]] = []
        contexts: list[dict[str, Any]] = []

        def cluster_entry(name: str, url: str) -> None:
            c: dict[str, Any] = {"server": url}
            if inline:
                c["certificate-authority-data"] = b64(self.ca_file)
            else:
                c["certificate-authority"] = str(self.ca_file)
            clusters.append({"name": name, "cluster": c})

        cluster_entry("waypost-test", server or self.base_url)
        specs: dict[str, Mapping[str, Any]] = {context: {"token": token, "namespace": namespace,
                                                         "client_cert": client_cert}}
        specs.update(extra_contexts or {})
        for name, spec in specs.items():
            user: dict[str, Any] = {}
            if spec.get("client_cert"):
                if inline:
                    user["client-certificate-data"] = b64(self.client_cert_file)
                    user["client-key-data"] = b64(self.client_key_file)
                else:
                    user["client-certificate"] = str(self.client_cert_file)
                    user["client-key"] = str(self.client_key_file)
            else:
                tok = spec.get("token", ADMIN_TOKEN)
                if tok:
                    user["token"] = tok
            users.append({"name": f"{name}-user", "user": user})
            cluster_name = "waypost-test"
            if spec.get("server") and name != context:
                cluster_name = f"{name}-cluster"
                cluster_entry(cluster_name, spec["server"])
            ctx: dict[str, Any] = {"cluster": cluster_name, "user": f"{name}-user"}
            if spec.get("namespace"):
                ctx["namespace"] = spec["namespace"]
            contexts.append({"name": name, "context": ctx})
        doc = {"apiVersion": "v1", "kind": "Config", "preferences": {}, "clusters": clusters, "users": users,
               "contexts": contexts, "current-context": context}
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            import yaml  # type: ignore[import-untyped]

            text = yaml.safe_dump(doc, sort_keys=False)
        except ImportError:
            text = json.dumps(doc, indent=2) + "\n"
        p.write_text(text)
        return p


# ---------------------------------------------------------------------------------------- private namespace


def _pid_namespace_ok() -> bool:
    """Whether ``unshare -p -f --kill-child --mount-proc`` works: then the host is PID 1 of its own PID
    namespace and the kernel kills everything it started when it dies, however it dies."""
    try:
        p = subprocess.run(["unshare", "-n", "-p", "-f", "--kill-child", "--mount-proc", "true"],
                           capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0


class NetnsHost:
    """``tests/netns_host.py`` in a private network namespace, driven over JSON lines (see that module).

    Build the apiserver before ``start()``: there is no network inside. ``run(name)`` raises AssertionError
    with the scenario's traceback and the host's recent stderr when it fails; a host that died (or was ended
    after a timeout) is started again by the next ``run``.
    """

    def __init__(self, binary: str | os.PathLike[str] | None = None, log_dir: str | os.PathLike[str] | None = None,
                 ready_timeout: float = 90.0, addresses: Sequence[str] = POD_ADDRESSES,
                 host_args: Sequence[str] = ()) -> None:
        self.binary = Path(binary) if binary else None
        self._own_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="waypost-netns-"))
        self.ready_timeout = ready_timeout
        self.addresses = tuple(addresses)
        self.host_args = list(host_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.starts = 0
        self.startup_seconds: float | None = None
        self._lines: queue.Queue[Any] = queue.Queue()
        self._stderr_path: Path | None = None
        self._stderr: Any = None
        self._pidns: bool | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        setup = ["ip link set lo up", *(f"ip addr add {a}/32 dev lo" for a in self.addresses)]
        inner = " && ".join([*setup, 'exec "$0" -m tests.netns_host "$@"'])
        if self._pidns is None:
            self._pidns = _pid_namespace_ok()
        isolate = ["-n", "-p", "-f", "--kill-child", "--mount-proc"] if self._pidns else ["-n"]
        return ["unshare", *isolate, "bash", "-c", inner, sys.executable,
                "--dir", str(self.log_dir / f"cluster-{self.starts}"), *self.host_args]

    def start(self) -> NetnsHost:
        if self.alive:
            return self
        if self.binary is None:
            self.binary = apiserver_binary()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
        env["WAYPOST_KUBE_APISERVER"] = str(self.binary)
        env["PYTHONUNBUFFERED"] = "1"
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy",
                  "ALL_PROXY"):
            env.pop(k, None)  # nothing outside is reachable from inside
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1  # each host start gets a log and a cluster directory of its own in log_dir
        self._stderr_path = self.log_dir / f"netns-host-{self.starts}.log"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 (closed in _reap)
        self._lines = queue.Queue()
        started = time.monotonic()
        log.info("starting %s", shlex.join(self.command()))
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        threading.Thread(target=self._read, args=(self.proc, self._lines), name="netns-host-stdout",
                         daemon=True).start()
        try:
            line = self._expect(lambda d: "ready" in d, self.ready_timeout, "the ready line")
        except AssertionError:
            self.stop()
            raise
        if not line.get("ready"):
            self.stop()
            raise AssertionError(f"netns host failed to start: {line.get('error')}\n{self.stderr_tail()}")
        self.ready = line
        self.startup_seconds = time.monotonic() - started
        return self

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], lines: queue.Queue[Any]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                lines.put(json.loads(text))
            except ValueError:
                log.debug("netns host stdout: %s", text)
        lines.put(None)

    def stderr_tail(self, n: int = 4000) -> str:
        if self._stderr_path is None:
            return ""
        with contextlib.suppress(ValueError, OSError):
            self._stderr.flush()
        try:
            return self._stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _expect(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"netns host: no {what} within {timeout:.0f} s; "
                                     f"stderr:\n{self.stderr_tail()}")
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self._lines.put(None)
                code = self.proc.wait(10) if self.proc is not None else None
                raise AssertionError(f"netns host exited (code {code}) before {what}; "
                                     f"stderr:\n{self.stderr_tail()}")
            if isinstance(line, dict) and pred(line):
                return line

    def run(self, name: str, timeout: float = 60.0, args: Mapping[str, Any] | None = None) -> None:
        """Run scenario ``name`` inside (bounded by ``timeout`` s there); AssertionError when it fails."""
        if not self.alive:
            if self.proc is not None:
                log.warning("netns host died (code %s); starting it again", self.proc.returncode)
                self._reap()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        request = {"scenario": name, "timeout": timeout, **({"args": dict(args)} if args else {})}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self._reap()
            raise AssertionError(f"netns host gone before scenario {name}: {e}\n{self.stderr_tail()}") from e
        try:
            # the host bounds the scenario itself; the margin covers reporting it (and its own slowness)
            answer = self._expect(lambda d: "ok" in d, timeout + 30.0, f"answer to scenario {name}")
        except AssertionError:
            self._kill()
            raise
        if not answer["ok"]:
            error = answer.get("error", "")
            if not self.alive or answer.get("exiting"):
                self._reap(wait=30.0)
            raise AssertionError(f"scenario {name} failed inside the private netns:\n{error}\n"
                                 f"--- netns host stderr (tail; all of it in {self._stderr_path}, the "
                                 f"apiserver's log in {self.log_dir}/cluster-{self.starts}) ---\n"
                                 f"{self.stderr_tail()}")

    def _kill(self) -> None:
        """End the host now: with the PID namespace, SIGKILL of unshare takes everything inside with it."""
        if self.proc is not None and self.proc.poll() is None:
            if not self._pidns:  # plain netns: let the host stop etcd and the apiserver first
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(30)
            if self.proc.poll() is None:
                self.proc.kill()
        self._reap()

    def _reap(self, wait: float = 10.0) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(wait)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    if f is not None:
                        f.close()
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()

    def stop(self, timeout: float = 45.0) -> None:
        """Close stdin (the host stops its cluster and exits), wait up to ``timeout`` s, then kill."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("netns host did not exit within %s s after stdin closed; killing it", timeout)
                self._kill()
        self._reap()
        if self._own_dir and os.environ.get("WAYPOST_K8S_KEEP") != "1":
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> NetnsHost:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "ADMIN_TOKEN", "POD_ADDRESSES", "READER_TOKEN", "K8sBuildError", "K8sUnavailable", "KubeApiError",
    "KubeCluster", "NetnsHost", "apiserver_binary", "skip_reason", "timeout_mark",
]
