"""Mapping of gRPC errors from etcd to waypost's exception hierarchy."""

from __future__ import annotations

import grpc

from ..errors import (
    KEY_ECHO_MAX,
    LeaseNotFound,
    PermissionDenied,
    RegistryError,
    RegistryUnavailable,
    WaypostError,
    shown_key,
)

# codes that say "this member could not serve the call now": another member may
UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: what a member answers when it cannot get a request through raft now (no leader, an election, a member cut
#: off from the others); some come as UNKNOWN: "context deadline exceeded" is the call's own deadline
#: expiring inside etcd while the request waited for a leader, "raft proposal dropped" a write refused
#: for want of one
_LEADER_TROUBLE = (
    "etcdserver: no leader",
    "etcdserver: leader changed",
    "etcdserver: request timed out",
    "raft proposal dropped",
    "context deadline exceeded",
)

_AUTH_RETRY_DETAILS = (
    "invalid auth token",
    "revision of auth store is old",
    "user name is empty",
)


def details(err: grpc.RpcError) -> str:
    fn = getattr(err, "details", None)
    return str(fn() or "") if callable(fn) else ""


def code(err: grpc.RpcError) -> grpc.StatusCode | None:
    fn = getattr(err, "code", None)
    return fn() if callable(fn) else None  # type: ignore[no-any-return]


def member_cannot_serve(err: grpc.RpcError) -> bool:
    """True when the member that answered could not serve the call now (unreachable, a deadline, no leader):
    another member may."""
    c = code(err)
    if c in UNAVAILABLE_CODES:
        return True
    d = details(err)
    return c == grpc.StatusCode.UNKNOWN and any(s in d for s in _LEADER_TROUBLE)


def is_no_leader(err: grpc.RpcError) -> bool:
    """etcd's ``no leader`` answer. For a call sent with ``hasleader`` metadata it comes from the check etcd
    makes before handling a request (its gRPC interceptor): the request was not handled, not even a write."""
    return code(err) == grpc.StatusCode.UNAVAILABLE and "etcdserver: no leader" in details(err)


def never_sent(err: grpc.RpcError) -> bool:
    """True when gRPC could not connect at all, so the request never left this process."""
    return code(err) == grpc.StatusCode.UNAVAILABLE and "failed to connect to all addresses" in details(err)


def is_auth_retryable(err: grpc.RpcError) -> bool:
    """True when a fresh token may fix the call (expired/invalidated token, e.g. after a restart)."""
    c = code(err)
    if c == grpc.StatusCode.UNAUTHENTICATED:
        return True
    d = details(err)
    return c == grpc.StatusCode.INVALID_ARGUMENT and any(s in d for s in _AUTH_RETRY_DETAILS)


def is_auth_reason(reason: str) -> bool:
    """True for a watch cancel reason that a fresh token may fix."""
    return any(s in reason for s in _AUTH_RETRY_DETAILS)


def is_compacted(err: grpc.RpcError) -> bool:
    return code(err) == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details(err)


def request_key(req: object) -> bytes | str:
    """The key a request is about (a txn's first operation's key), for error messages; '' if none."""
    key = getattr(req, "key", b"")
    if not key:
        for op in getattr(req, "success", ()) or ():
            inner = getattr(op, op.WhichOneof("request") or "", None) if hasattr(op, "WhichOneof") else None
            key = getattr(inner, "key", b"")
            if key:
                break
    return key if isinstance(key, (bytes, str)) else str(key)


#: a key this big is what made a request "too large" (etcd's default request limit is 1.5 MiB)
TOO_LARGE_KEY = 512 * 1024

#: the etcd services the unary calls go to, by operation (for "not an etcd endpoint")
_SERVICES = {"lease grant": "Lease", "lease revoke": "Lease", "lease time-to-live": "Lease",
             "status": "Maintenance", "authenticate": "Auth"}


def map_error(err: grpc.RpcError, op: str, where: str = "", key: bytes | str = "") -> WaypostError:
    """A waypost exception for a failed etcd call; the message names the operation and the key."""
    c = code(err)
    d = details(err)
    at = f" on {where}" if where else ""
    name = c.name if c is not None else "UNKNOWN"
    head = f"etcd {op} failed{at}"
    if c == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in d:
        # sent without credentials to an etcd with auth on (the key is of no use here)
        return PermissionDenied(f"{head}: etcd requires authentication: add user:pass@ to the registry URL "
                                "(etcd://user:pass@host:2379; dial targets also take ?user=...&password=...)")
    if c == grpc.StatusCode.UNIMPLEMENTED:
        service = _SERVICES.get(op, "KV")
        return RegistryError(f"{head}: not an etcd endpoint (it answered UNIMPLEMENTED to the etcd {service} "
                             "service); check the registry URL's host:port")
    if key and "too large" in d:
        size = len(key) if isinstance(key, bytes) else len(key.encode("utf-8", "surrogateescape"))
        if size > TOO_LARGE_KEY:
            return RegistryError(f"{head}: key too large ({size} bytes; etcd: {d}): {shown_key(key[:KEY_ECHO_MAX])}...")
    msg = f"{head}: {name}: {d}"
    if key:
        msg += f" (key {shown_key(key)})"
    if member_cannot_serve(err):
        return RegistryUnavailable(msg)
    if c == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(msg)
    if c == grpc.StatusCode.UNAUTHENTICATED or (
        c == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in d
    ):
        return PermissionDenied(msg)
    if c == grpc.StatusCode.NOT_FOUND and "lease not found" in d:
        return LeaseNotFound(msg)
    return RegistryError(msg)
