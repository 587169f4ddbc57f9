"""The four xDS resources of an exported service, built from its Export and its backend list.

For the service NAME (what a client dials as ``xds:///NAME``):

- **Listener NAME**: ``api_listener`` = HttpConnectionManager with the router filter and RDS over ADS
  (route config NAME);
- **RouteConfiguration NAME**: one virtual host, domains ``["*"]``, routes to cluster NAME: one per method and
  service of the export's ``service_config``, then the catch-all (prefix ``""``), with retries (retry_policy) and
  the ``hash_header`` (hash_policy): ``routes.py``;
- **Cluster NAME**: type EDS over ADS, ``load_balancing_policy`` and ``outlier_detection`` (``policy.py``), and
  ``circuit_breakers`` with the export's ``max_requests``, and with ``load_reporting``, ``lrs_server`` (self)
  and ``lrs_report_endpoint_metrics`` (``lrs.py``);
- a route with its own ``max_requests``: a Cluster ``C#routes[I]`` per cluster C it sends to, with that limit and
  C's endpoints (``eds_cluster_config.service_name`` C): no assignment of its own;
- **ClusterLoadAssignment NAME**: the endpoints, mapped as below;
- with a traffic policy (``traffic.py``): a Cluster and a ClusterLoadAssignment per subset (``NAME/KEY=VALUE``, its
  instances only), routes to them (``weighted_clusters`` for a split), and the fault filter (``faults.py``) before
  the router in the Listener when the export or one of its routes injects faults.

Each backend becomes an endpoint as docs/xds.md, "The mapping", lays out: its weight as
``load_balancing_weight`` (0: ``health_status`` DRAINING), its ``region``/``zone`` as the locality, one
``sub_zone`` per distinct weight inside a locality for the policies that spread evenly inside one
(``_sub_zones``), ``prefer=zone:Z`` as priorities.

Everything is deterministic (backends sorted by address, localities by name), so the same inputs give the
same bytes in every control-plane replica.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Sequence

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message

from ..balancer.weights import DEFAULT_WEIGHT, weight_of
from ..netutil import split_host_port
from ..types import Backend
from .exports import Export
from .faults import FAULT_FILTER, http_fault
from .load_stats import REPORTED_ORCA
from .policy import lb_policy, outlier_detection, weights_need_localities
from .routes import routes
from .traffic import fault_filters_needed, route_clusters, subset_backends, subset_limit

log = logging.getLogger("waypost.xds")

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
#: the order a client asks for them
TYPES = (LISTENER, ROUTE, CLUSTER, ENDPOINT)
SHORT = {LISTENER: "LDS", ROUTE: "RDS", CLUSTER: "CDS", ENDPOINT: "EDS"}
#: the "full state" types of state-of-the-world xDS: a response carries every subscribed resource that exists, so
#: leaving a subscribed name out tells the client it does not exist (and an empty subscription is a wildcard)
FULL_STATE = (LISTENER, CLUSTER)
_ADS = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                      resource_api_version=config_source_pb2.V3)
#: the server the client talks ADS to (gRPC's clients accept only this as a Cluster's ``lrs_server``)
_SELF = config_source_pb2.ConfigSource(self=config_source_pb2.SelfConfigSource(),
                                       resource_api_version=config_source_pb2.V3)


def pack(msg: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg, deterministic=True)
    return packed


def _router() -> list[hcm_pb2.HttpFilter]:
    return [hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router()))]


def _http_filters(export: Export) -> list[hcm_pb2.HttpFilter]:
    """The router, after the fault filter when the export or one of its routes injects faults (gRFC A33)."""
    if not fault_filters_needed(export):
        return _router()
    return [hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=pack(http_fault(export.fault))), *_router()]


def listener(export: Export) -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager(rds=hcm_pb2.Rds(config_source=_ADS, route_config_name=export.name),
                                        http_filters=_http_filters(export))
    return listener_pb2.Listener(name=export.name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def not_exported_listener(name: str) -> listener_pb2.Listener:
    """The Listener answering a subscription to a name that is not exported: an inline RouteConfiguration with
    no virtual host, so the client fails its calls at once with UNAVAILABLE naming it (grpcio: ``LDS resource
    NAME: could not find VirtualHost for NAME in RouteConfiguration``).

    Leaving the name out of the LDS response would be state of the world's way to say it does not exist, but
    grpcio, grpc-go and grpc-java 1.85 do not conclude that for a name they never received (the response may
    answer an older request, they reason): they wait for their 15 s does-not-exist timer. Exported later, the
    name gets its real Listener in the next response (same name, new version), which the client takes."""
    rc = route_pb2.RouteConfiguration(name=f"{name} (not exported by this control plane)")
    hcm = hcm_pb2.HttpConnectionManager(route_config=rc, http_filters=_router())
    return listener_pb2.Listener(name=name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def route_config(export: Export, empty: frozenset[str] = frozenset()) -> route_pb2.RouteConfiguration:
    """The export's RouteConfiguration; ``empty``: its subsets with no endpoint now (left out of the splits)."""
    vhost = route_components_pb2.VirtualHost(name=export.name, domains=["*"], routes=routes(export, empty))
    return route_pb2.RouteConfiguration(name=export.name, virtual_hosts=[vhost])


def cluster(export: Export, name: str | None = None, *, endpoints: str | None = None,
            max_requests: int | None = None) -> cluster_pb2.Cluster:
    """The export's Cluster, or (``name``) one of its subsets' with the same policy; ``endpoints``: the
    ClusterLoadAssignment it reads when not its own name (a route's own cluster, ``traffic.route_cluster``);
    ``max_requests``: its limit instead of the export's."""
    c = cluster_pb2.Cluster(
        name=name or export.name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=_ADS, service_name=endpoints or ""),
        load_balancing_policy=lb_policy(export),
    )
    if export.outlier_detection is not None:
        c.outlier_detection.CopyFrom(outlier_detection(export.outlier_detection, f"export {export.name!r}"))
    limit = max_requests if max_requests is not None else export.max_requests
    if limit is not None:  # gRFC A32: gRPC reads the DEFAULT priority's max_requests only
        c.circuit_breakers.thresholds.append(circuit_breaker_pb2.CircuitBreakers.Thresholds(
            priority=base_pb2.DEFAULT, max_requests=wrappers_pb2.UInt32Value(value=limit)))
    if export.load_reporting:  # load reports to this control plane (lrs.py)
        c.lrs_server.CopyFrom(_SELF)
        c.lrs_report_endpoint_metrics.extend(REPORTED_ORCA)
    return c


def _socket(address: str) -> address_pb2.Address | None:
    """The socket address of an IP ``host:port``; None for anything else (gRPC's xDS clients reject a host name
    in an endpoint, and grpcio then rejects the whole assignment)."""
    parts = _ip_port(address)
    if parts is None:
        return None
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=parts[0], port_value=parts[1]))


@functools.lru_cache(maxsize=1 << 16)
def _ip_port(address: str) -> tuple[str, int] | None:
    """``address`` as (IP text, port), parsed once: a change in a 1,000-endpoint service rebuilds its whole
    assignment, and parsing every address again was most of that (23 ms of 25 ms per rebuild)."""
    try:
        host, port = split_host_port(address, what="address")
        ip = ipaddress.ip_address(host.strip("[]")) if host else None
    except ValueError:
        return None
    if ip is None or port is None:
        return None
    return str(ip), port


def _text(metadata: object, key: str) -> str:
    value = metadata.get(key) if hasattr(metadata, "get") else None  # type: ignore[union-attr]
    return value if isinstance(value, str) else "" if value is None else str(value)


def load_assignment(export: Export, backends: Sequence[Backend],
                    cluster_name: str | None = None) -> endpoint_pb2.ClusterLoadAssignment:
    """The ClusterLoadAssignment of ``backends`` (the mapping table of the module docstring), for the cluster
    ``cluster_name`` (default: the export's name)."""
    groups: dict[tuple[str, str], list[tuple[int, endpoint_components_pb2.LbEndpoint]]] = {}
    for b in sorted(backends, key=lambda b: b.address):
        addr = _socket(b.address)
        if addr is None:
            log.warning("xds %s: leaving out %r: an endpoint must be an IP address and a port (gRPC's xDS "
                        "clients reject host names)", export.name, b.address)
            continue
        weight, problem = weight_of(b.metadata)
        if problem:
            log.warning("xds %s: %s: %s", export.name, b.address, problem)
        ep = endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(address=addr))
        if weight == 0:
            ep.health_status = health_check_pb2.DRAINING
            ep.load_balancing_weight.value = 1
        else:
            ep.health_status = health_check_pb2.HEALTHY
            weight = ep.load_balancing_weight.value = min(weight, 2**31 // max(len(backends), 1))
        groups.setdefault((_text(b.metadata, "region"), _text(b.metadata, "zone")), []).append((weight, ep))
    priorities = _priorities(export, list(groups))
    split = weights_need_localities(export)
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name or export.name)
    for loc in sorted(groups):
        region, zone = loc
        for sub_zone, members in _sub_zones(groups[loc], split):
            cla.endpoints.append(endpoint_components_pb2.LocalityLbEndpoints(
                locality=base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone),
                lb_endpoints=[ep for _, ep in members],
                load_balancing_weight={"value": max(sum(w for w, _ in members), 1)},
                priority=priorities[loc],
            ))
    return cla


def _sub_zones(members: list[tuple[int, endpoint_components_pb2.LbEndpoint]],
               split: bool) -> list[tuple[str, list[tuple[int, endpoint_components_pb2.LbEndpoint]]]]:
    """One locality's endpoints as (sub_zone, [(weight, endpoint)]): all in sub_zone "" when the policy honours
    endpoint weights (``split`` false) or every serving endpoint has the same weight (then the resources are
    those of a fleet without weights); else one sub-zone ``weight-W`` per distinct weight W, in decreasing
    order, so a policy that spreads evenly inside a locality (round_robin, least_request, pick_first) still
    gives each backend its share through the locality weights. Drained endpoints (weight 0) join the first
    sub-zone: they take no traffic and add no weight."""
    serving = sorted({w for w, _ in members if w}, reverse=True)
    if not split or len(serving) < 2:
        return [("", members)]
    by_weight: dict[int, list[tuple[int, endpoint_components_pb2.LbEndpoint]]] = {w: [] for w in serving}
    for w, ep in members:
        by_weight[w or serving[0]].append((w, ep))
    return [(f"weight-{w}", by_weight[w]) for w in serving]


def _priorities(export: Export, localities: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    if export.prefer is None:
        return dict.fromkeys(localities, 0)
    kind, want = export.prefer
    index = 0 if kind == "region" else 1
    preferred = {loc for loc in localities if loc[index] == want}
    if not preferred or len(preferred) == len(localities):
        return dict.fromkeys(localities, 0)
    return {loc: 0 if loc in preferred else 1 for loc in localities}


def static_resources(export: Export) -> dict[str, Message]:
    """Listener, RouteConfiguration and Cluster of the export (they depend on the export only, but for the
    RouteConfiguration of an export with subsets: ``route_config(export, empty)`` once its endpoints are known)."""
    return {LISTENER: listener(export), ROUTE: route_config(export), CLUSTER: cluster(export)}


def subset_clusters(export: Export) -> dict[str, cluster_pb2.Cluster]:
    """The Cluster of each of the export's subsets, and of each route with its own ``max_requests`` (reading the
    endpoints of the subset or export cluster it stands for), by name (``traffic.py``)."""
    out = {s.cluster(export.name): cluster(export, s.cluster(export.name), max_requests=subset_limit(export, s.name))
           for s in export.subsets}
    for name, (base, limit) in route_clusters(export).items():
        out[name] = cluster(export, name, endpoints=base, max_requests=limit)
    return out


def subset_assignments(export: Export, backends: Sequence[Backend]
                       ) -> dict[str, tuple[endpoint_pb2.ClusterLoadAssignment, int]]:
    """Per subset name: the ClusterLoadAssignment of the backends it selects (named by its cluster), and how
    many of its endpoints take calls (not drained)."""
    out = {}
    for s in export.subsets:
        cla = load_assignment(export, subset_backends(s, backends))
        cla.cluster_name = s.cluster(export.name)
        live = sum(ep.health_status != health_check_pb2.DRAINING for loc in cla.endpoints for ep in loc.lb_endpoints)
        out[s.name] = (cla, live)
    return out


__all__ = ["CLUSTER", "DEFAULT_WEIGHT", "ENDPOINT", "LISTENER", "ROUTE", "SHORT", "TYPES", "cluster", "listener",
           "load_assignment", "pack", "route_config", "static_resources", "subset_assignments", "subset_clusters"]
