"""kubeconfig files for a test apiserver: token or client-certificate users, one context or several."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.k8s.api import ADMIN_TOKEN, KubeEndpoint


class KubeconfigWriter(KubeEndpoint):
    """``write_kubeconfig`` for a ``KubeEndpoint``."""

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


__all__ = ["KubeconfigWriter"]
