"""More words for a backend's failed call: which backend it was, and the usual cause.

Added to the status details of a call that fails for good (after any retry), original text first, in
brackets: ``Socket closed [backend 10.0.0.5:8080: the call was in flight when its connection failed;
dial(..., retries=N) retries idempotent methods on another backend]``. Two cases:

- UNAVAILABLE: the backend's address; without a retry policy, a hint about ``retries=`` (only a retry moves a
  call that was already on a backend that died; the balancer moves new calls);
- UNIMPLEMENTED "unknown service" on a ``direct:///`` (or bare ``host:port``) target whose server is a registry's
  (a kind's ``misdial`` recognises it: its port, or on sync channels one bounded call made once per address and
  only on this error path): a registry endpoint dialed as a backend, so say which target was probably meant.
"""

from __future__ import annotations

import grpc

from ..kind_table import misdialed
from ..service_config import RetryPolicy
from .retry import never_sent


def explain(code: grpc.StatusCode, details: str | None, address: str, *, direct: bool,
            retry_policy: RetryPolicy | None, probe: bool = False) -> str | None:
    """What to add to a failed call's details (None: nothing). ``direct``: the channel's target lists addresses
    (no registry); ``probe``: may ask the backend whether it is a registry's (blocking, bounded: sync channels
    only)."""
    if code is grpc.StatusCode.UNAVAILABLE:
        if retry_policy is None and not never_sent(code, details):
            return (f"backend {address}: the call was in flight when its connection failed; dial(..., retries=N) "
                    "retries idempotent methods on another backend")
        return f"backend {address}"
    if code is grpc.StatusCode.UNIMPLEMENTED and direct and "unknown service" in (details or ""):
        meant = misdialed(address, probe)
        return f"backend {address}: {meant}" if meant else None
    return None


def with_explanation(details: str | None, extra: str) -> str:
    return f"{details or ''} [{extra}]".lstrip()
