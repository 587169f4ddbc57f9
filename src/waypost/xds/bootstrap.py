"""The gRPC xDS bootstrap: how a client finds the control plane (gRFC A27; several servers: A71).

A client reads it from the file named by ``GRPC_XDS_BOOTSTRAP`` or from the JSON text in
``GRPC_XDS_BOOTSTRAP_CONFIG``. Each server carries ``server_features`` ``["xds_v3", "ignore_resource_deletion"]``:
with ``ignore_resource_deletion`` a client keeps a Listener or Cluster that a response leaves out (it never
drops a working service because a control plane restarted with a partial view). Several servers are tried
in order (fallback, A71): list every replica.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

SERVER_FEATURES = ("xds_v3", "ignore_resource_deletion")


def bootstrap(servers: Sequence[str], node_id: str | None = None, *, cluster: str = "waypost",
              zone: str | None = None) -> dict[str, Any]:
    """The bootstrap object for control planes at ``servers`` (``host:port``, insecure channel credentials)."""
    if not servers:
        raise ValueError("bootstrap: at least one --server HOST:PORT is needed")
    for s in servers:
        if not isinstance(s, str) or ":" not in s or any(c.isspace() for c in s):
            raise ValueError(f"bootstrap: server {s!r}: expected HOST:PORT")
    node: dict[str, Any] = {"id": node_id or f"waypost-{socket.gethostname()}", "cluster": cluster}
    if zone:
        node["locality"] = {"zone": zone}
    return {
        "xds_servers": [{"server_uri": s, "channel_creds": [{"type": "insecure"}],
                         "server_features": list(SERVER_FEATURES)} for s in servers],
        "node": node,
    }


def bootstrap_json(servers: Sequence[str], node_id: str | None = None, **kw: Any) -> str:
    return json.dumps(bootstrap(servers, node_id, **kw), indent=2, sort_keys=True)
