"""More words for a backend's failed call: which backend it was, and the usual cause.

Added to the status details of a call that fails for good (after any retry), original text first, in
brackets: ``Socket closed [backend 10.0.0.5:8080: the call was in flight when its connection failed;
dial(..., retries=N) retries idempotent methods on another backend]``. Two cases:

- UNAVAILABLE: the backend's address; without a retry policy, a hint about ``retries=`` (only a retry moves a
  call that was already on a backend that died; the balancer moves new calls);
- UNIMPLEMENTED "unknown service" on a ``direct:///`` (or bare ``host:port``) target whose server answers like
  etcd: the target is an etcd endpoint dialed as a backend, so say which target was probably meant. "Answers
  like etcd": port 2379, or (sync channels) one bounded call of etcd's ``Maintenance/Status`` that succeeds,
  made once per address and only on this error path.
"""

from __future__ import annotations

import threading

import grpc

from ..service_config import RetryPolicy
from .retry import never_sent

#: etcd's client port
ETCD_CLIENT_PORT = 2379
#: how long asking a backend whether it is etcd may take
PROBE_TIMEOUT = 1.0
#: addresses remembered as etcd or not (bounded: probing stops once it is full)
_PROBED_MAX = 256
_probed: dict[str, bool] = {}
_probe_lock = threading.Lock()
_ETCD_STATUS = "/etcdserverpb.Maintenance/Status"


def explain(code: grpc.StatusCode, details: str | None, address: str, *, direct: bool,
            retry_policy: RetryPolicy | None, probe: bool = False) -> str | None:
    """What to add to a failed call's details (None: nothing). ``direct``: the channel's target lists addresses
    (no registry); ``probe``: may ask the backend whether it is etcd (blocking, bounded: sync channels only)."""
    if code is grpc.StatusCode.UNAVAILABLE:
        if retry_policy is None and not never_sent(code, details):
            return (f"backend {address}: the call was in flight when its connection failed; dial(..., retries=N) "
                    "retries idempotent methods on another backend")
        return f"backend {address}"
    if code is grpc.StatusCode.UNIMPLEMENTED and direct and "unknown service" in (details or "") \
            and looks_like_etcd(address, probe):
        return (f"backend {address}: this looks like an etcd endpoint: did you mean "
                f"etcd:///{address}?key=SERVICE_KEY (the key the servers register under)?")
    return None


def with_explanation(details: str | None, extra: str) -> str:
    return f"{details or ''} [{extra}]".lstrip()


def looks_like_etcd(address: str, probe: bool) -> bool:
    """Port 2379, or an answer to etcd's Status call (asked once per address when ``probe``)."""
    if address.rpartition(":")[2] == str(ETCD_CLIENT_PORT):
        return True
    known = _probed.get(address)
    if known is not None or not probe:
        return bool(known)
    with _probe_lock:
        if address not in _probed and len(_probed) >= _PROBED_MAX:
            return False
    channel = grpc.insecure_channel(address)
    try:
        channel.unary_unary(_ETCD_STATUS)(b"", timeout=PROBE_TIMEOUT)
        answer = True
    except grpc.RpcError:
        answer = False
    finally:
        channel.close()
    with _probe_lock:
        _probed[address] = answer
    return answer
