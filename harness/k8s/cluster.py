"""A real Kubernetes control plane for the tests: etcd (``LocalEtcd``) + kube-apiserver on free ports in a temporary
directory, with token and client-certificate authentication, RBAC, the REST helpers of harness/k8s/api.py, kubeconfig
writing, apiserver stop/start/restart on the same port, and ``force_watch_gone()`` (a watch resumed from an older
resourceVersion then gets 410 Gone).

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

Every process here is started by this module and stopped by it by its PID (SIGTERM, SIGKILL after a bound);
``harness/proc_reaper.py`` stops what is left when the test process ends, killed or not.
"""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness import proc_reaper
from harness.k8s.api import KubeApi
from harness.k8s.build import apiserver_binary
from harness.k8s.kubeconfig import KubeconfigWriter
from harness.k8s.pki import make_pki
from waypost.etcd.local import LocalEtcd, free_port


class KubeCluster(KubeApi, KubeconfigWriter):
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

    def __enter__(self) -> KubeCluster:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        make_pki(self.dir / "pki")
        # tracked before etcd starts: a test run ended during the start leaves neither process behind
        proc_reaper.track(self, self.stop)
        if self.etcd is None:
            self.etcd = LocalEtcd(1, base_dir=self.dir / "etcd")
        self.etcd.start()
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
        proc, self.proc = self.proc, None
        proc_reaper.stop_process(proc, timeout, kill=kill)

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
        proc_reaper.untrack(self)
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


__all__ = ["KubeCluster"]
