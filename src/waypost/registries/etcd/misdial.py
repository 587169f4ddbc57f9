"""An etcd endpoint dialed as a backend (the kind's ``misdial``): a ``direct:///`` target (or a bare ``host:port``)
that names etcd's client port, or (sync channels, on a call that failed with "unknown service") whose server
answers etcd's ``Maintenance/Status``, was almost certainly meant as an etcd target with a key."""

from __future__ import annotations

import threading

import grpc

from .config import DEFAULT_PORT

#: how long asking a backend whether it is etcd may take
PROBE_TIMEOUT = 1.0
#: addresses remembered as etcd or not (bounded: probing stops once it is full)
_PROBED_MAX = 256
_probed: dict[str, bool] = {}
_probe_lock = threading.Lock()
_ETCD_STATUS = "/etcdserverpb.Maintenance/Status"


def meant_target(address: str, probe: bool) -> str | None:
    """The etcd target ``address`` was probably meant as (None: it does not look like etcd)."""
    return f"etcd:///{address}?key=SERVICE_KEY" if looks_like_etcd(address, probe) else None


def looks_like_etcd(address: str, probe: bool) -> bool:
    """Port 2379, or an answer to etcd's Status call (asked once per address when ``probe``)."""
    if address.rpartition(":")[2] == str(DEFAULT_PORT):
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
