"""The session timeout a ZooKeeper server granted, which is what decides when our ephemeral nodes go.

The server bounds the timeout a client asks for to its own ``[minSessionTimeout, maxSessionTimeout]`` (by default
2 and 20 ticks) and says which value it granted in its answer to the connect request. Everything we count from the
session (when a node is presumed gone after a cut, the outage clock, the warnings) must use the granted value: a
server with ``maxSessionTimeout=3000`` drops the node 3 s after a cut even when 10 s was asked.

kazoo reads the granted value but keeps it in a local variable of its connect step, so ``record_granted`` wraps that
client's connection handler's request call to note the connect answer's ``time_out`` on the client. Should a kazoo
version lay this out differently, ``granted`` answers None and callers keep the value they asked for (logged once).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("waypost.zk")

_ATTR = "_waypost_granted_session_timeout"
_warned = False


def record_granted(client: Any) -> None:
    """Note, on ``client``, the session timeout each new session is granted (see the module's docstring)."""
    global _warned
    from kazoo.protocol.serialization import Connect

    conn: Any = getattr(client, "_connection", None)
    invoke = getattr(conn, "_invoke", None)
    if invoke is None:
        if not _warned:
            _warned = True
            log.warning("this kazoo version hides the session timeout ZooKeeper grants: waypost counts the one it "
                        "asked for (a server whose maxSessionTimeout is lower drops nodes sooner than counted)")
        return

    def noting_invoke(timeout: float, request: Any, xid: Any = None) -> Any:  # on kazoo's connection thread
        answer = invoke(timeout, request, xid)
        if isinstance(request, Connect) and isinstance(answer, tuple) and answer:
            granted_ms = getattr(answer[0], "time_out", 0)
            if isinstance(granted_ms, int) and granted_ms > 0:
                setattr(client, _ATTR, granted_ms / 1000.0)
        return answer

    conn._invoke = noting_invoke


def granted(client: Any) -> float | None:
    """The session timeout (s) the server granted ``client``'s current session; None before one was granted."""
    value = getattr(client, _ATTR, None)
    return value if isinstance(value, float) else None
