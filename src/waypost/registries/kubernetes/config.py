"""Where a k8s:// target's apiserver is and how to authenticate, chosen as kubectl and client-go do.

1. ``?kubeconfig=PATH`` in the target (or ``?context=``): that kubeconfig (and context);
2. inside a pod (``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT`` set, service-account token
   present): the in-cluster config: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the
   service account's CA and token, the pod's namespace;
3. else ``$KUBECONFIG`` (several files joined with ``:`` are merged, as kubectl does) or ``~/.kube/config``:
   its current context (token, client certificate, exec plugins: whatever kubernetes_asyncio supports).

A target without a namespace uses the pod's namespace in-cluster, the context's namespace with a kubeconfig,
else ``default``.

The service-account token is projected and rotated by the kubelet (it expires after an hour by default):
``_TokenFile`` re-reads it whenever the file changes (one ``stat`` per request), so a long-running client
never sends an expired token, and the next watch after a rotation already uses the new one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidTarget

#: Where the kubelet mounts a pod's service account (token, ca.crt, namespace).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_NAMESPACE = "default"
INSTALL_HINT = "k8s:// targets need the k8s extra: pip install 'waypost[k8s]'"


def require_client() -> None:
    """Raise a clear ImportError when kubernetes_asyncio is missing (at dial time, not on first use)."""
    try:
        import kubernetes_asyncio  # noqa: F401
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e


@dataclass
class ClientConfig:
    """A kubernetes_asyncio ``Configuration`` plus what the resolver needs besides it."""

    configuration: Any
    #: the namespace for targets that name none
    namespace: str
    #: where it came from, for logs and errors: "in-cluster" or "kubeconfig PATH (context C)"
    source: str


class _TokenFile:
    """``refresh_api_key_hook``: put the token file's current content in the configuration when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.reads = 0

    def __call__(self, configuration: Any) -> None:
        try:
            st = self.path.stat()
        except OSError:
            return  # mid-rotation or gone: keep the last token (the request then fails and is retried)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        token = self.path.read_text().strip()
        if token:
            configuration.api_key["BearerToken"] = token
            configuration.api_key_prefix["BearerToken"] = "Bearer"
            self._stamp = stamp
            self.reads += 1


def in_cluster_available(environ: Any = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and bool(env.get("KUBERNETES_SERVICE_PORT")) and \
        (SERVICE_ACCOUNT_DIR / "token").is_file()


def kubeconfig_paths(explicit: str | None = None) -> list[str]:
    """The kubeconfig files to read: the explicit one, else ``$KUBECONFIG`` (``:``-separated), else
    ``~/.kube/config``; only those that exist."""
    if explicit:
        return [explicit]
    env = os.environ.get("KUBECONFIG")
    candidates = [p for p in env.split(os.pathsep) if p] if env else [str(Path.home() / ".kube" / "config")]
    return [p for p in candidates if Path(p).is_file()]


def _in_cluster() -> ClientConfig:
    from kubernetes_asyncio.client import Configuration

    from ...netutil import join_host_port

    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    ca = SERVICE_ACCOUNT_DIR / "ca.crt"
    if not ca.is_file():
        raise InvalidTarget(f"in-cluster Kubernetes config: the service account's CA {ca} is missing")
    config = Configuration()
    config.host = f"https://{join_host_port(host, int(port))}"
    config.ssl_ca_cert = str(ca)
    hook = _TokenFile(SERVICE_ACCOUNT_DIR / "token")
    hook(config)
    config.refresh_api_key_hook = hook
    ns_file = SERVICE_ACCOUNT_DIR / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.is_file() else ""
    return ClientConfig(config, namespace or DEFAULT_NAMESPACE, "in-cluster")


async def _from_kubeconfig(paths: list[str], context: str | None) -> ClientConfig:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import ConfigException
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger

    where = f"kubeconfig {os.pathsep.join(paths)}"
    try:
        merged = KubeConfigMerger(os.pathsep.join(paths))
        loader = KubeConfigLoader(config_dict=merged.config, active_context=context)
        config = Configuration()
        await loader.load_and_set(config)
    except ConfigException as e:
        raise InvalidTarget(f"k8s: cannot use {where}{f' (context {context})' if context else ''}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidTarget(f"k8s: malformed {where}: {type(e).__name__}: {e}") from None
    current = loader.current_context or {}
    name = current.get("name", context or "")
    namespace = (current.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE
    return ClientConfig(config, namespace, f"{where} (context {name})")


async def load(kubeconfig: str | None = None, context: str | None = None) -> ClientConfig:
    """The client configuration for a target's ``kubeconfig=`` / ``context=`` options (see the module doc).
    Raises InvalidTarget naming what is missing."""
    require_client()
    if kubeconfig and not Path(kubeconfig).is_file():
        raise InvalidTarget(f"k8s: kubeconfig={kubeconfig} does not exist")
    if not kubeconfig and not context and in_cluster_available():
        return _in_cluster()
    paths = kubeconfig_paths(kubeconfig)
    if not paths:
        raise InvalidTarget(
            "k8s: no Kubernetes configuration: not inside a pod (KUBERNETES_SERVICE_HOST unset or no service-account "
            f"token in {SERVICE_ACCOUNT_DIR}) and no kubeconfig ($KUBECONFIG or ~/.kube/config); pass "
            "?kubeconfig=PATH in the target")
    return await _from_kubeconfig(paths, context)
