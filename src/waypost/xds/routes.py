"""The routes of an export's RouteConfiguration: its ``service_config`` (per-method retries) as routes gRPC's xDS
clients honour, or the export's ``retries`` option on one catch-all route.

A gRPC service config's ``methodConfig`` becomes routes in gRPC's precedence order (gRFC A28: the first
matching route wins): a method's ``match.path``, then a service's ``match.prefix``, then the catch-all; each
carries the entry's ``retryPolicy`` as ``retry_policy`` (gRFC A44; docs/xds.md, "The mapping"). xDS has no backoff
multiplier: gRPC uses 2.

**A methodConfig timeout is not sent.** A route's ``max_stream_duration`` (gRFC A31) is where xDS carries it, but
grpcio 1.85 ends calls about 1.06 s before it (with 1 s every call fails at once with DEADLINE_EXCEEDED, with 2 s
calls end at 0.94 s), while grpc-go and grpc-java honour it: a methodConfig ``timeout`` is therefore left out (a
warning says so). An export's ``routes`` may set one explicitly (``timeout``, ``traffic.py``), knowing this.

The export's own ``routes`` (``traffic.py``) come first, in their order, each with the export's default retry
policy; the service_config routes and the catch-all go where the export's ``split`` sends (its whole cluster
without one).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import wrappers_pb2

from .errors import XdsConfigError
from .faults import FAULT_FILTER, http_fault
from .matching import Match
from .model import Export
from .policy import hash_policies
from .traffic import Route, Split, destination, owns_clusters

if TYPE_CHECKING:
    from ..service_config.model import RetryPolicy, ServiceConfig

log = logging.getLogger("waypost.xds")
_DENOMINATORS = {100: percent_pb2.FractionalPercent.HUNDRED, 10_000: percent_pb2.FractionalPercent.TEN_THOUSAND,
                 1_000_000: percent_pb2.FractionalPercent.MILLION}
_CODES = {grpc.StatusCode.CANCELLED: "cancelled", grpc.StatusCode.DEADLINE_EXCEEDED: "deadline-exceeded",
          grpc.StatusCode.INTERNAL: "internal", grpc.StatusCode.RESOURCE_EXHAUSTED: "resource-exhausted",
          grpc.StatusCode.UNAVAILABLE: "unavailable"}


def parse_service_config(value: object, where: str) -> ServiceConfig:
    """A service config (an object or JSON text) holding only ``methodConfig``, validated by waypost's parser."""
    import json

    from ..service_config import parse_service_config as parse

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise XdsConfigError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise XdsConfigError(f"{where}: expected a service config object")
    other = sorted(set(value) - {"methodConfig"})
    if other:
        raise XdsConfigError(f"{where}: only methodConfig maps to xDS routes, not {str(other[0])[:40]!r} "
                             "(the load-balancing policy is the export's policy option)")
    try:
        cfg = parse(value, balancer="round_robin")
    except ValueError as e:
        raise XdsConfigError(f"{where}: {e}") from None
    if any(mc.timeout is not None for mc in cfg.method_configs):
        log.warning("xds %s: the service config's timeouts are not sent over xDS (grpcio ends calls about 1 s "
                    "before a route's max_stream_duration); set deadlines in the clients, or a route's timeout "
                    "(the export's routes option)", where)
    for service, method, path in cfg.names:
        mc = cfg.method_config(f"/{service}/{method}")
        rp = mc.retry_policy if mc is not None else None
        if rp is not None:
            bad = sorted(c.name for c in rp.retryable_status_codes if c not in _CODES)
            if bad:
                raise XdsConfigError(f"{where}: {path}: gRPC's xDS retries honour only "
                                     f"{', '.join(c.name for c in _CODES)}; not {', '.join(bad)}")
    return cfg


def _action(export: Export, retry: rc_pb2.RetryPolicy | None, to: Split | None = None,
            empty: frozenset[str] = frozenset(), own: int | None = None) -> rc_pb2.RouteAction:
    action = rc_pb2.RouteAction(hash_policy=hash_policies(export))
    pairs = destination(export, to, empty, own)
    if len(pairs) == 1:
        action.cluster = pairs[0][0]
    else:  # gRFC A28: gRPC picks a cluster per call in proportion to the weights
        action.weighted_clusters.clusters.extend(
            rc_pb2.WeightedCluster.ClusterWeight(name=name, weight=wrappers_pb2.UInt32Value(value=weight))
            for name, weight in pairs)
    if retry is not None:
        action.retry_policy.CopyFrom(retry)
    return action


def _retry(rp: RetryPolicy | None) -> rc_pb2.RetryPolicy | None:
    if rp is None or rp.max_attempts < 2:
        return None
    codes = [_CODES[c] for c in _CODES if c in rp.retryable_status_codes]
    policy = rc_pb2.RetryPolicy(retry_on=",".join(codes), num_retries=wrappers_pb2.UInt32Value(value=rp.max_attempts - 1))
    policy.retry_back_off.base_interval.FromNanoseconds(round(rp.initial_backoff * 1e9))
    policy.retry_back_off.max_interval.FromNanoseconds(round(rp.max_backoff * 1e9))
    return policy


def _export_retry(export: Export) -> rc_pb2.RetryPolicy | None:
    if not export.retries:
        return None
    return rc_pb2.RetryPolicy(retry_on=",".join(export.retry_on),
                              num_retries=wrappers_pb2.UInt32Value(value=export.retries))


def routes(export: Export, empty: frozenset[str] = frozenset()) -> list[rc_pb2.Route]:
    """The export's routes (module docstring): its own ``routes``, then per method and per service of its
    service_config, then the catch-all; ``empty``: the subsets that have no endpoint now (``traffic.py``)."""
    cfg = export.service_config
    out: list[rc_pb2.Route] = []
    default_retry = _export_retry(export)
    if cfg is not None:
        mc = cfg.method_config("/")
        default_retry = _retry(mc.retry_policy) if mc is not None else None
    out += [_traffic_route(export, i, r, default_retry, empty) for i, r in enumerate(export.routes)]
    if cfg is not None:
        methods = sorted({(s, m) for s, m, _ in cfg.names if s and m})
        services = sorted({s for s, m, _ in cfg.names if s and not m})
        for service, method in methods:
            mc = cfg.method_config(f"/{service}/{method}")
            assert mc is not None  # cfg.names lists the configured names only
            out.append(rc_pb2.Route(match=rc_pb2.RouteMatch(path=f"/{service}/{method}"),
                                    route=_action(export, _retry(mc.retry_policy), empty=empty)))
        for service in services:
            mc = cfg.method_config(f"/{service}/")
            assert mc is not None  # cfg.names lists the configured names only
            out.append(rc_pb2.Route(match=rc_pb2.RouteMatch(prefix=f"/{service}/"),
                                    route=_action(export, _retry(mc.retry_policy), empty=empty)))
    out.append(rc_pb2.Route(match=rc_pb2.RouteMatch(prefix=""), route=_action(export, default_retry, empty=empty)))
    return out


def route_match(m: Match) -> rc_pb2.RouteMatch:
    """The RouteMatch of a route's matchers (``matching.py``), in the fields every gRPC client reads (gRFC A28):
    the path as ``prefix`` / ``path`` / ``safe_regex`` with ``case_sensitive``; headers as ``string_match``
    (exact, prefix, suffix, contains), ``safe_regex_match``, ``range_match`` or ``present_match``, each with
    ``invert_match``; the share of calls as ``runtime_fraction.default_value``."""
    match = rc_pb2.RouteMatch(prefix="")
    p = m.path
    if p is not None:
        if p.kind == "safe_regex":
            match.safe_regex.regex = p.value
        else:
            setattr(match, p.kind, p.value)
        if p.case_sensitive is not None:
            match.case_sensitive.value = p.case_sensitive
    for h in m.headers:
        hm = rc_pb2.HeaderMatcher(name=h.name, invert_match=h.invert)
        if h.kind == "present":
            hm.present_match = h.present
        elif h.kind == "range":
            hm.range_match.start, hm.range_match.end = h.start, h.end
        elif h.kind == "safe_regex":
            hm.safe_regex_match.regex = h.value
        else:
            hm.string_match.CopyFrom(string_pb2.StringMatcher(**{h.kind: h.value}))
        match.headers.append(hm)
    if m.fraction is not None:
        match.runtime_fraction.default_value.CopyFrom(percent_pb2.FractionalPercent(
            numerator=m.fraction.numerator, denominator=_DENOMINATORS[m.fraction.denominator]))
    return match


def _traffic_route(export: Export, index: int, r: Route, retry: rc_pb2.RetryPolicy | None,
                   empty: frozenset[str]) -> rc_pb2.Route:
    """``routes[index]`` of the export, with the export's default retry policy."""
    own = index if owns_clusters(r) else None
    action = _action(export, retry, r.to, empty, own)
    if r.timeout is not None:
        action.max_stream_duration.max_stream_duration.FromNanoseconds(round(r.timeout * 1e9))
    route = rc_pb2.Route(match=route_match(r.match), route=action)
    if r.fault is not None:
        route.typed_per_filter_config[FAULT_FILTER].Pack(http_fault(r.fault), deterministic=True)
    return route
