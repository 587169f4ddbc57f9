"""Kratos' ZooKeeper layout (go-kratos/kratos ``contrib/registry/zookeeper``): where an instance lives and what it holds.

Nodes (Kratos ``register.go``: ``New`` defaults the namespace to ``/microservices``, ``WithRootPath`` changes it;
``Register`` joins the paths with Go's ``path.Join``)::

    /microservices                      persistent, data b"" (created if missing)
    /microservices/<service name>       persistent, data b"" (created if missing)
    /microservices/<service name>/<id>  EPHEMERAL, data = the instance's JSON (below)

Parents are created with empty data and the open ACL (world:anyone, all permissions), as Kratos does without
``WithDigestACL``. The instance node is named by the instance ID (Kratos' default ID is a UUID; waypost's too,
unless ``id`` is given) and lives as long as the session that created it. Before creating it Kratos deletes a
node already at that path (a previous incarnation with the same ID), and it re-creates the node when its session
changes (``reRegister`` polls the session ID every second).

Data: Go's ``json.Marshal`` of Kratos' ``registry.ServiceInstance``, fields in struct order::

    {"id":"<id>","name":"<service>","version":"<version>","metadata":{"k":"v"}|null,
     "endpoints":["grpc://10.0.0.5:9000","http://10.0.0.5:8000"]}

``metadata`` is ``map[string]string`` (``null`` when empty, keys sorted); ``endpoints`` are URLs: Kratos' gRPC
server writes ``grpc://host:port`` (``grpcs://`` with TLS; ``?isSecure=true`` is the older spelling of that), its
HTTP server ``http://``. The byte-for-byte encoder and the decoder are the ones of Kratos' etcd records
(``waypost.registry.formats.Kratos``, the same ``ServiceInstance`` JSON): the publisher and the resolver use it
with ``instance_path`` below, which is exactly the key that encoder produces (namespace, service, id joined).

Watching (Kratos ``watcher.go``): a children watch of ``/microservices/<service>`` (an exists watch while it does
not exist), then ``Children`` + ``Get`` of every child, skipping instances whose ``name`` is not the service.
Kratos sets no data watch, so it sees a changed instance (metadata) only at the next change of the children;
waypost's resolver watches each child's data too.

Node names follow ZooKeeper's rules (``PathUtils.validatePath``): not empty, no ``/``, not ``.`` or ``..``, no NUL
or other control characters and none of U+D800..U+F8FF, U+FFF0 and above. ``/zookeeper`` is the server's own.
"""

from __future__ import annotations

import re

DEFAULT_NAMESPACE = "/microservices"

# (characters beyond U+FFFF are surrogate pairs in Java, which the same rule refuses)
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff]")
MAX_NAME_BYTES = 1024


class LayoutError(ValueError):
    """A name or path that cannot be a ZooKeeper node of the layout; the message says why."""


def check_node_name(name: object, what: str = "node name") -> str:
    """``name`` if it can be one ZooKeeper node name (one path component), else LayoutError naming ``what``."""
    if not isinstance(name, str) or not name:
        raise LayoutError(f"{what} must be a non-empty string, got {name!r}")
    shown = repr(name) if len(name) <= 80 else repr(name[:80]) + "..."
    if "/" in name:
        raise LayoutError(f"{what} {shown} cannot contain '/' (it is one ZooKeeper node name)")
    if name in (".", ".."):
        raise LayoutError(f"{what} {shown} is not a valid ZooKeeper node name")
    bad = _BAD_CHARS.search(name)
    if bad is not None:
        raise LayoutError(f"{what} {shown} contains {bad.group()!r}, which ZooKeeper refuses in node names")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise LayoutError(f"{what} {shown} is longer than {MAX_NAME_BYTES} bytes")
    return name


def check_namespace(namespace: object) -> str:
    """The namespace (root path) in canonical form: absolute, no trailing '/' (except the root itself), every
    component a valid node name, not under ``/zookeeper``."""
    if not isinstance(namespace, str) or not namespace.startswith("/"):
        raise LayoutError(f"namespace must be an absolute ZooKeeper path such as {DEFAULT_NAMESPACE!r}, "
                          f"got {namespace!r}")
    parts = namespace.strip("/").split("/") if namespace.strip("/") else []
    for part in parts:
        check_node_name(part, f"namespace {namespace!r}: component")
    if parts and parts[0] == "zookeeper":
        raise LayoutError(f"namespace {namespace!r} is under /zookeeper, which is the server's own")
    return "/" + "/".join(parts)


def _join(*parts: str) -> str:
    # Go's path.Join of an absolute namespace and names: one '/' between parts, none doubled at the root
    head = parts[0].rstrip("/")
    return "/".join((head, *parts[1:]))


def service_path(namespace: str, service: str) -> str:
    """``<namespace>/<service>``: the node whose children are the service's instances."""
    return _join(check_namespace(namespace), check_node_name(service, "service name"))


def instance_path(namespace: str, service: str, instance_id: str) -> str:
    """``<namespace>/<service>/<id>``: the ephemeral node of one instance."""
    return _join(service_path(namespace, service), check_node_name(instance_id, "instance id"))


__all__ = ["DEFAULT_NAMESPACE", "LayoutError", "check_namespace", "check_node_name", "instance_path", "service_path"]
