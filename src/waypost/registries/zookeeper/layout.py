"""Kratos' ZooKeeper layout (``contrib/registry/zookeeper``, docs/zookeeper.md): ``<namespace>/<service>/<id>``, joined
as Go's ``path.Join``. Node names follow ZooKeeper's ``PathUtils.validatePath``: not empty, no ``/``, not ``.`` or
``..``, no control characters, none of U+D800..U+F8FF, U+FFF0 and above; ``/zookeeper`` is the server's own."""

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


def service_path(namespace: str, service: str) -> str:
    """``<namespace>/<service>`` (as Go's path.Join: no '/' doubled at the root): the instances' parent."""
    return f"{check_namespace(namespace).rstrip('/')}/{check_node_name(service, 'service name')}"


def instance_path(namespace: str, service: str, instance_id: str) -> str:
    """``<namespace>/<service>/<id>``: the ephemeral node of one instance."""
    return f"{service_path(namespace, service)}/{check_node_name(instance_id, 'instance id')}"
