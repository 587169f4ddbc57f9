"""Mapping of gRPC errors from etcd to waypost's exception hierarchy."""

from __future__ import annotations

import grpc

from ..errors import (
    LeaseNotFound,
    PermissionDenied,
    RegistryError,
    RegistryUnavailable,
    WaypostError,
)

# codes that say "this member could not serve the call now": another member may
UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

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


def request_key(req: object) -> str:
    """The key a request is about (a txn's first operation's key), for error messages; '' if none."""
    key = getattr(req, "key", b"")
    if not key:
        for op in getattr(req, "success", ()) or ():
            inner = getattr(op, op.WhichOneof("request") or "", None) if hasattr(op, "WhichOneof") else None
            key = getattr(inner, "key", b"")
            if key:
                break
    if not key:
        return ""
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)


def map_error(err: grpc.RpcError, op: str, where: str = "", key: str = "") -> WaypostError:
    """A waypost exception for a failed etcd call; the message names the operation and the key."""
    c = code(err)
    d = details(err)
    at = f" on {where}" if where else ""
    name = c.name if c is not None else "UNKNOWN"
    msg = f"etcd {op} failed{at}: {name}: {d}"
    if key:
        msg += f" (key {key!r})"
    if c in UNAVAILABLE_CODES:
        return RegistryUnavailable(msg)
    if c == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(msg)
    if c == grpc.StatusCode.UNAUTHENTICATED or (
        c == grpc.StatusCode.INVALID_ARGUMENT and ("authentication failed" in d or "user name is empty" in d)
    ):
        return PermissionDenied(msg)
    if c == grpc.StatusCode.NOT_FOUND and "lease not found" in d:
        return LeaseNotFound(msg)
    return RegistryError(msg)
