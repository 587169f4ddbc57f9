"""The xDS clients of a control plane, for the console (``waypost console --xds HOST:PORT``).

Polls the control plane's client status service (CSDS: ``FetchClientStatus``, what ``waypost xds status`` shows)
every ``interval`` seconds and keeps, per exported service (the Listener names the clients subscribed to), each
client holding it: its node id, zone, and per type (LDS, RDS, CDS, EDS) the worst state of what it was sent
(NACKED before STALE before NOT SENT before SYNCED) with the NACK's message. ``snapshot()`` is what ``GET
/api/xds`` answers; an unreachable control plane is an ``error`` there, and the last clients seen stay listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

log = logging.getLogger("waypost.console")

_RANK = {"ERROR": 0, "STALE": 1, "NOT_SENT": 2, "SYNCED": 3}
_SHOWN = {"ERROR": "NACKED", "STALE": "STALE", "NOT_SENT": "NOT SENT", "SYNCED": "SYNCED"}


def group_by_service(response: Any) -> dict[str, list[dict[str, Any]]]:
    """service -> its clients, from a ClientStatusResponse (a client without a Listener is listed under the
    clusters it subscribed to)."""
    from envoy.service.status.v3 import csds_pb2

    from ..xds.resources import CLUSTER, LISTENER, SHORT

    out: dict[str, list[dict[str, Any]]] = {}
    for config in response.config:
        states: dict[str, str] = {}
        nacks: list[str] = []
        names = {LISTENER: set(), CLUSTER: set()}  # type: dict[str, set[str]]
        for g in config.generic_xds_configs:
            short = SHORT.get(g.type_url, g.type_url.rsplit(".", 1)[-1])
            status = csds_pb2.ConfigStatus.Name(g.config_status)
            if short not in states or _RANK.get(status, 9) < _RANK.get(states[short], 9):
                states[short] = status
            if g.config_status == csds_pb2.ERROR:
                nacks.append(f"{short} {g.name}: {g.error_state.details}")
            if g.type_url in names:
                names[g.type_url].add(g.name)
        node = config.node
        entry = {"node": node.id or "?", "cluster": node.cluster,
                 "zone": "/".join(p for p in (node.locality.region, node.locality.zone) if p),
                 "types": {t: _SHOWN.get(s, s) for t, s in states.items()}, "nacks": nacks}
        for service in sorted(names[LISTENER] or names[CLUSTER] or {"?"}):
            out.setdefault(service, []).append(entry)
    return out


class XdsClients:
    """The poller (module docstring); ``start()`` on the console's loop, ``close()`` to end it."""

    def __init__(self, server: str, interval: float = 2.0, timeout: float = 5.0) -> None:
        self.server, self.interval, self.timeout = server, interval, timeout
        self.services: dict[str, list[dict[str, Any]]] = {}
        self.error: str | None = None
        self.updated = 0.0
        self._task: asyncio.Task[None] | None = None

    def snapshot(self) -> dict[str, Any]:
        return {"server": self.server, "error": self.error, "updated": self.updated, "services": self.services}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        import grpc
        from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

        async with grpc.aio.insecure_channel(self.server) as channel:
            stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
            while True:
                try:
                    response = await stub.FetchClientStatus(csds_pb2.ClientStatusRequest(
                        exclude_resource_contents=True), timeout=self.timeout)
                    self.services, self.error, self.updated = group_by_service(response), None, time.time()
                except grpc.RpcError as e:
                    code = e.code() if isinstance(e, grpc.Call) else None
                    error = ("not an xDS control plane with CSDS" if code is grpc.StatusCode.UNIMPLEMENTED
                             else f"{code.name if code else 'error'}: {e.details() if isinstance(e, grpc.Call) else e}")
                    if error != self.error:
                        log.warning("console: xDS client status from %s: %s", self.server, error)
                    self.error = error
                await asyncio.sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
