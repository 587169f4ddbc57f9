"""The xDS clients of a control plane, for the console (``waypost console --xds HOST:PORT``).

Polls the control plane's client status service (CSDS: ``FetchClientStatus``, what ``waypost xds status`` shows)
every ``interval`` seconds and keeps, per exported service (the Listener names the clients subscribed to), each
client holding it: its node id, zone, and per type (LDS, RDS, CDS, EDS) the worst state of what it was sent
(NACKED before STALE before NOT SENT before SYNCED) with the NACK's message. ``snapshot()`` is what ``GET
/api/xds`` answers; an unreachable control plane is an ``error`` there, and the last clients seen stay listed.

The split of each service (``traffic``): what its clients were actually sent, read from one of them (a second
``FetchClientStatus`` with the resources' contents, matched on that client's node id, so the answer holds one
client's resources rather than every client's): the default (last) route of its RouteConfiguration, and, for a
``weighted_clusters`` split, each cluster's weight, share and the addresses of its ClusterLoadAssignment. A subset
cluster is named ``NAME/KEY=VALUE`` (``waypost.xds.traffic``): the page shows ``version=v2 · 10 %`` beside those
instances. A service none of whose clients is connected has no entry: nobody was sent a split.

The load its clients report (``load``), for exports with load reporting: the control plane's
``waypost.xds.v1.LoadStatus/Fetch`` (what ``waypost xds status --load`` shows), grouped per export: each
cluster's dropped calls and, per locality, the rates of the clients' last reports, calls in flight, totals and
ORCA metrics (``load_by_export``). A control plane that does not serve it leaves ``load`` empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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


def traffic_of(response: Any, service: str) -> dict[str, Any] | None:
    """``service``'s default-route split as the client(s) of ``response`` were sent it: ``{"split": [{"cluster",
    "subset", "weight", "share", "addresses"}, ...]}`` (one entry, share 1, when the route sends to one cluster);
    None when the response holds no RouteConfiguration of that name."""
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.config.route.v3 import route_pb2

    from ..xds.resources import ENDPOINT, ROUTE

    route_config: Any = None
    addresses: dict[str, list[str]] = {}
    for config in response.config:
        for g in config.generic_xds_configs:
            if not g.HasField("xds_config"):
                continue
            if g.type_url == ROUTE and g.name == service and route_config is None:
                route_config = route_pb2.RouteConfiguration.FromString(g.xds_config.value)
            elif g.type_url == ENDPOINT and g.name not in addresses:
                cla = endpoint_pb2.ClusterLoadAssignment.FromString(g.xds_config.value)
                addresses[g.name] = sorted(
                    f"{a.address}:{a.port_value}" if ":" not in a.address else f"[{a.address}]:{a.port_value}"
                    for loc in cla.endpoints for e in loc.lb_endpoints
                    for a in (e.endpoint.address.socket_address,))
    if route_config is None or not route_config.virtual_hosts or not route_config.virtual_hosts[0].routes:
        return None
    action = route_config.virtual_hosts[0].routes[-1].route  # the catch-all comes last
    if action.HasField("weighted_clusters"):
        parts = [(c.name, c.weight.value) for c in action.weighted_clusters.clusters]
    else:
        parts = [(action.cluster, 1)]
    total = sum(w for _, w in parts) or 1
    return {"split": [{"cluster": name, "subset": name.split("/", 1)[1] if "/" in name else "",
                       "weight": weight, "share": weight / total, "addresses": addresses.get(name, [])}
                      for name, weight in parts]}


def load_by_export(view: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """export -> its clusters as the load view has them (``waypost.xds.load_stats.LoadStats.view``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for cluster in view.get("clusters", []):
        out.setdefault(cluster["export"], []).append(cluster)
    return out


class XdsClients:
    """The poller (module docstring); ``start()`` on the console's loop, ``close()`` to end it."""

    def __init__(self, server: str, interval: float = 2.0, timeout: float = 5.0) -> None:
        self.server, self.interval, self.timeout = server, interval, timeout
        self.services: dict[str, list[dict[str, Any]]] = {}
        #: service -> its split as its clients were sent it (``traffic_of``)
        self.traffic: dict[str, dict[str, Any]] = {}
        #: export -> its clusters' reported load (``load_by_export``)
        self.load: dict[str, list[dict[str, Any]]] = {}
        self.error: str | None = None
        self.updated = 0.0
        self._task: asyncio.Task[None] | None = None

    def snapshot(self) -> dict[str, Any]:
        return {"server": self.server, "error": self.error, "updated": self.updated, "services": self.services,
                "traffic": self.traffic, "load": self.load}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        import grpc
        from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
        from envoy.type.matcher.v3 import node_pb2, string_pb2

        from ..xds.lrs import STATUS_PATH

        async with grpc.aio.insecure_channel(self.server) as channel:
            stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
            fetch_load = channel.unary_unary(STATUS_PATH, request_serializer=lambda b: b,
                                             response_deserializer=json.loads)
            while True:
                try:
                    response = await stub.FetchClientStatus(csds_pb2.ClientStatusRequest(
                        exclude_resource_contents=True), timeout=self.timeout)
                    services = group_by_service(response)
                    traffic = {}
                    contents: dict[str, Any] = {}  # node id -> its resources, fetched once per poll
                    for service, clients in services.items():
                        node = next((c["node"] for c in clients
                                     if c["types"].get("RDS") == "SYNCED" and c["node"] != "?"), None)
                        if node is None:
                            continue
                        if node not in contents:
                            contents[node] = await stub.FetchClientStatus(csds_pb2.ClientStatusRequest(
                                node_matchers=[node_pb2.NodeMatcher(node_id=string_pb2.StringMatcher(exact=node))]),
                                timeout=self.timeout)
                        found = traffic_of(contents[node], service)
                        if found is not None:
                            traffic[service] = found
                    try:
                        load = load_by_export(await fetch_load(b"", timeout=self.timeout))
                    except grpc.RpcError as e:
                        if not isinstance(e, grpc.Call) or e.code() is not grpc.StatusCode.UNIMPLEMENTED:
                            raise
                        load = {}  # a control plane without load reporting
                    self.services, self.traffic, self.load = services, traffic, load
                    self.error, self.updated = None, time.time()
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
