"""The gRPC xDS bootstrap: how a client finds the control plane (gRFC A27; several servers: A71).

A client reads it from the file named by ``GRPC_XDS_BOOTSTRAP`` or from the JSON text in
``GRPC_XDS_BOOTSTRAP_CONFIG``. Each server carries ``server_features`` ``["xds_v3", "ignore_resource_deletion"]``:
with ``ignore_resource_deletion`` a client keeps a Listener or Cluster that a response leaves out (it never
drops a working service because a control plane restarted with a partial view). Several servers are tried
in order (fallback, A71): list every replica.

Channel credentials are ``insecure``, or ``tls`` (gRFC A65: the file-watcher certificate provider's fields,
``ca_certificate_file`` to verify the control plane, ``certificate_file`` + ``private_key_file`` for mTLS,
``refresh_interval``; the client re-reads the files). The paths are the client's: they are not checked here.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from typing import Any

SERVER_FEATURES = ("xds_v3", "ignore_resource_deletion")
INSECURE: Mapping[str, Any] = {"type": "insecure"}


def tls_channel_creds(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                      refresh_interval: int | None = None) -> dict[str, Any]:
    """A65's ``tls`` channel credentials: verify the server with ``ca_file`` (None: the system's roots), show
    ``cert_file`` / ``key_file`` (mTLS; both or neither), re-read every ``refresh_interval`` seconds (None:
    the client's default, 10 minutes)."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("bootstrap: --cert-file and --key-file go together (the client's certificate and its key)")
    config: dict[str, Any] = {}
    for field, value in (("ca_certificate_file", ca_file), ("certificate_file", cert_file),
                         ("private_key_file", key_file)):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise ValueError(f"bootstrap: {field} must be a file path, got {value!r}")
            config[field] = value
    if refresh_interval is not None:
        if isinstance(refresh_interval, bool) or not isinstance(refresh_interval, int) or refresh_interval < 1:
            raise ValueError(f"bootstrap: refresh interval must be a whole number of seconds (1 or more), got "
                             f"{refresh_interval!r}")
        config["refresh_interval"] = f"{refresh_interval}s"  # a protobuf Duration in JSON
    return {"type": "tls", "config": config}


def bootstrap(servers: Sequence[str], node_id: str | None = None, *, cluster: str = "waypost",
              zone: str | None = None, channel_creds: Mapping[str, Any] = INSECURE) -> dict[str, Any]:
    """The bootstrap object for control planes at ``servers`` (``host:port``), reached with ``channel_creds``
    (``INSECURE`` or ``tls_channel_creds(...)``)."""
    if not servers:
        raise ValueError("bootstrap: at least one --server HOST:PORT is needed")
    for s in servers:
        if not isinstance(s, str) or ":" not in s or any(c.isspace() for c in s):
            raise ValueError(f"bootstrap: server {s!r}: expected HOST:PORT")
    node: dict[str, Any] = {"id": node_id or f"waypost-{socket.gethostname()}", "cluster": cluster}
    if zone:
        node["locality"] = {"zone": zone}
    return {
        "xds_servers": [{"server_uri": s, "channel_creds": [dict(channel_creds)],
                         "server_features": list(SERVER_FEATURES)} for s in servers],
        "node": node,
    }


def bootstrap_json(servers: Sequence[str], node_id: str | None = None, **kw: Any) -> str:
    return json.dumps(bootstrap(servers, node_id, **kw), indent=2, sort_keys=True)
