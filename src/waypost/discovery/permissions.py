"""etcd permissions: telling a refusal by a role's permissions from one of credentials, and the etcdctl
command that grants what is missing (see docs/operations.md, "etcd permissions")."""

from __future__ import annotations

from ..errors import PermissionDenied


def grant_hint(key: str, permission: str, prefix: bool = True) -> str:
    """The etcdctl command that gives a role ``permission`` (read, write, readwrite) on ``key``."""
    return f"etcdctl role grant-permission ROLE {'--prefix=true ' if prefix else ''}{permission} {key}"


def role_refused(e: PermissionDenied) -> bool:
    """True when etcd refused for lack of a role's permission (not for missing or wrong credentials)."""
    return "PERMISSION_DENIED" in str(e)
