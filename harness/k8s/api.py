"""A small synchronous client of a kube-apiserver's REST API (stdlib only): requests with a bearer token or the
admin client certificate, raw watches, and helpers for the objects the tests write (namespaces, Services,
EndpointSlices, RBAC grants).

``KubeEndpoint`` says where an apiserver listens and where its files are (``dir``: the serving certificate in
``certs/``, the client CA and the admin client certificate in ``pki/``, see harness/k8s/pki.py); ``KubeApi`` adds the
requests to it. ``ADMIN_TOKEN`` (user admin, group system:masters) may do anything, ``READER_TOKEN`` (user reader)
only what ``KubeApi.grant()`` allows.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ADMIN_TOKEN = "testtoken"
READER_TOKEN = "readertoken"


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


class KubeEndpoint:
    """Where an apiserver listens (``bind_host``, ``port``) and its directory ``dir``."""

    bind_host: str
    port: int
    dir: Path

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


class KubeApi(KubeEndpoint):
    """REST helpers on a ``KubeEndpoint``: one HTTPS connection per request."""

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


__all__ = ["ADMIN_TOKEN", "READER_TOKEN", "KubeApi", "KubeApiError", "KubeEndpoint"]
