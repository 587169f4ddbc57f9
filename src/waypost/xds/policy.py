"""waypost policy names -> the xDS ``Cluster.load_balancing_policy``, outlier detection and route hashing.

What each export ``policy`` is sent as, and its ``policy_config`` keys (gRPC's JSON names): docs/xds.md, "The
mapping". ``blackoutPeriod`` is never sent as 0: grpc-go drops a 0 and waits its 10 s default, so 0 becomes 1 ns
(the default is 1 s). waypost's own policies (peak_ewma, prequal, p2c_ewma, smooth_weighted_round_robin, ...)
run in waypost's channel, not in gRPC's xDS clients: asking for one is an error at start naming the others.

``outlier_detection`` takes the config of waypost's ``outlier_detection`` policy (interval,
baseEjectionTime, maxEjectionTime, maxEjectionPercent, successRateEjection, failurePercentageEjection)
and becomes ``Cluster.outlier_detection``; an ejection kind left out is sent with enforcement 0 (off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from envoy.config.cluster.v3 import cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import extension_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message

from ..durations import DurationError, parse_nonnegative_duration
from .errors import XdsConfigError
from .model import Export

#: the policies an xDS client runs itself (export ``policy`` values); consistent_hash is waypost's name of ring_hash,
#: weighted_round_robin the name of gRPC's A58 policy in a service config (client_side_weighted_round_robin in xDS)
XDS_POLICIES = ("round_robin", "pick_first", "ring_hash", "consistent_hash", "least_request",
                "client_side_weighted_round_robin", "weighted_round_robin")
_ALIASES = {"consistent_hash": "ring_hash", "weighted_round_robin": "client_side_weighted_round_robin"}
_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "round_robin": (),
    "pick_first": ("shuffleAddressList",),
    "ring_hash": ("minRingSize", "maxRingSize"),
    "least_request": ("choiceCount",),
    "client_side_weighted_round_robin": ("enableOobLoadReport", "oobReportingPeriod", "blackoutPeriod",
                                         "weightExpirationPeriod", "weightUpdatePeriod", "errorUtilizationPenalty"),
}
#: blackout sent when the config names none (gRPC's own default, 10 s, holds weights back a long time)
DEFAULT_BLACKOUT = 1.0


def _fail(where: str, message: str) -> NoReturn:
    raise XdsConfigError(f"{where}: {message}")


def check_export(export: Export, where: str) -> None:
    """Raise XdsConfigError when the export's policy, its config, hash_header or outlier config cannot be served."""
    name = export.policy
    if name not in XDS_POLICIES:
        from ..balancer.policies import known_policies

        served = ", ".join(p for p in XDS_POLICIES if p not in _ALIASES)
        if name in known_policies():
            _fail(where, f"policy {name!r} runs only in waypost's own channel, not in gRPC's xDS clients; "
                         f"over xDS: {served}")
        _fail(where, f"unknown policy {name!r}; over xDS: {served}")
    keys_known = _CONFIG_KEYS[_ALIASES.get(name, name)]
    unknown = sorted(set(export.policy_config) - set(keys_known))
    if unknown:
        keys = ", ".join(keys_known) or "none"
        _fail(where, f"policy_config: unknown key {unknown[0]!r} for {name} (known: {keys})")
    lb_policy(export, where)  # every value checked by building it once
    if export.hash_header and _ALIASES.get(name, name) != "ring_hash":
        _fail(where, f"hash_header needs policy ring_hash (the policy is {name})")
    if export.outlier_detection is not None:
        outlier_detection(export.outlier_detection, where)


def _typed(name: str, msg: Message) -> cluster_pb2.LoadBalancingPolicy.Policy:
    packed = any_pb2.Any()
    packed.Pack(msg)
    return cluster_pb2.LoadBalancingPolicy.Policy(
        typed_extension_config=extension_pb2.TypedExtensionConfig(name=name, typed_config=packed))


def _duration(value: object, where: str) -> duration_pb2.Duration:
    try:
        seconds = parse_nonnegative_duration(value)
    except DurationError as e:
        _fail(where, str(e))
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def _int(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        _fail(where, f"expected an integer from {lo} to {hi}, got {value!r}")
    return int(value)


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        _fail(where, f"expected true or false, got {value!r}")
    return bool(value)


def weights_need_localities(export: Export) -> bool:
    """Whether the export's policy spreads evenly over a locality's endpoints, so registered weights reach the
    client only as locality weights (``resources.load_assignment`` then puts each distinct weight in a sub-zone
    of its own): round_robin, pick_first and least_request. ring_hash honours endpoint weights itself, and
    client_side_weighted_round_robin weighs by the backends' ORCA reports inside one locality (sub-zones would
    fence its weights in)."""
    return _ALIASES.get(export.policy, export.policy) in ("round_robin", "pick_first", "least_request")


def lb_policy(export: Export, where: str = "") -> cluster_pb2.LoadBalancingPolicy:
    """The Cluster's ``load_balancing_policy`` for the export (see the module's table)."""
    where = where or f"export {export.name!r}"
    cfg = export.policy_config
    name = _ALIASES.get(export.policy, export.policy)
    if name == "ring_hash":
        ring = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.XX_HASH)
        lo = _int(cfg.get("minRingSize", 1024), f"{where}: policy_config.minRingSize", 1, 8_388_608)
        hi = _int(cfg.get("maxRingSize", 8_388_608), f"{where}: policy_config.maxRingSize", 1, 8_388_608)
        if lo > hi:
            _fail(where, f"policy_config: minRingSize {lo} > maxRingSize {hi}")
        ring.minimum_ring_size.value, ring.maximum_ring_size.value = lo, hi
        return cluster_pb2.LoadBalancingPolicy(policies=[_typed("envoy.load_balancing_policies.ring_hash", ring)])
    children: list[cluster_pb2.LoadBalancingPolicy.Policy]
    if name == "pick_first":
        shuffle = _flag(cfg.get("shuffleAddressList", False), f"{where}: policy_config.shuffleAddressList")
        children = [_typed("envoy.load_balancing_policies.pick_first",
                           pick_first_pb2.PickFirst(shuffle_address_list=shuffle))]
    elif name == "least_request":
        lr = least_request_pb2.LeastRequest()
        lr.choice_count.value = _int(cfg.get("choiceCount", 2), f"{where}: policy_config.choiceCount", 2, 10)
        children = [_typed("envoy.load_balancing_policies.least_request", lr),
                    _typed("envoy.load_balancing_policies.round_robin", round_robin_pb2.RoundRobin())]
    elif name == "client_side_weighted_round_robin":
        children = [_typed("envoy.load_balancing_policies.client_side_weighted_round_robin", _cswrr(cfg, where))]
    else:
        children = [_typed("envoy.load_balancing_policies.round_robin", round_robin_pb2.RoundRobin())]
    wrr = wrr_locality_pb2.WrrLocality(endpoint_picking_policy=cluster_pb2.LoadBalancingPolicy(policies=children))
    return cluster_pb2.LoadBalancingPolicy(policies=[_typed("envoy.load_balancing_policies.wrr_locality", wrr)])


def _cswrr(cfg: Mapping[str, Any], where: str) -> cswrr_pb2.ClientSideWeightedRoundRobin:
    msg = cswrr_pb2.ClientSideWeightedRoundRobin()
    if "enableOobLoadReport" in cfg:
        msg.enable_oob_load_report.value = _flag(cfg["enableOobLoadReport"], f"{where}: policy_config.enableOobLoadReport")
    for key, fld in (("oobReportingPeriod", "oob_reporting_period"), ("weightExpirationPeriod", "weight_expiration_period"),
                     ("weightUpdatePeriod", "weight_update_period")):
        if key in cfg:
            getattr(msg, fld).CopyFrom(_duration(cfg[key], f"{where}: policy_config.{key}"))
    blackout = _duration(cfg.get("blackoutPeriod", f"{DEFAULT_BLACKOUT}s"), f"{where}: policy_config.blackoutPeriod")
    if blackout.seconds == 0 and blackout.nanos == 0:
        blackout.nanos = 1  # zero means "no blackout", but grpc-go drops a zero and applies its 10 s default
    msg.blackout_period.CopyFrom(blackout)
    if "errorUtilizationPenalty" in cfg:
        penalty = cfg["errorUtilizationPenalty"]
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0 <= penalty < 1e6:
            _fail(where, f"policy_config.errorUtilizationPenalty: expected a number >= 0, got {penalty!r}")
        msg.error_utilization_penalty.value = float(penalty)
    return msg


def outlier_detection(raw: Mapping[str, Any], where: str) -> outlier_detection_pb2.OutlierDetection:
    """waypost's ``outlier_detection`` policy config -> ``Cluster.outlier_detection`` (gRFC A50's mapping)."""
    from ..balancer import policies as _builtins  # noqa: F401 -- the child policy names must be registered
    from ..balancer.outlier_detection import OutlierConfig
    from ..errors import InvalidServiceConfig

    raw = {k: v for k, v in raw.items() if k != "childPolicy"}  # the child is the export's policy
    try:
        cfg = OutlierConfig.parse(raw, "outlier_detection")
    except InvalidServiceConfig as e:
        _fail(where, str(e))
    od = outlier_detection_pb2.OutlierDetection()
    od.interval.FromNanoseconds(round(cfg.interval * 1e9))
    od.base_ejection_time.FromNanoseconds(round(cfg.base_ejection_time * 1e9))
    od.max_ejection_time.FromNanoseconds(round(cfg.max_ejection_time * 1e9))
    od.max_ejection_percent.value = cfg.max_ejection_percent
    sr, fp = cfg.success_rate, cfg.failure_percentage
    od.enforcing_success_rate.value = sr["enforcementPercentage"] if sr else 0
    if sr:
        od.success_rate_stdev_factor.value = sr["stdevFactor"]
        od.success_rate_minimum_hosts.value = sr["minimumHosts"]
        od.success_rate_request_volume.value = sr["requestVolume"]
    od.enforcing_failure_percentage.value = fp["enforcementPercentage"] if fp else 0
    if fp:
        od.failure_percentage_threshold.value = fp["threshold"]
        od.failure_percentage_minimum_hosts.value = fp["minimumHosts"]
        od.failure_percentage_request_volume.value = fp["requestVolume"]
    return od


def hash_policies(export: Export) -> list[route_components_pb2.RouteAction.HashPolicy]:
    """The route's hash_policy: the export's ``hash_header`` (ring_hash only), else none."""
    if not export.hash_header:
        return []
    return [route_components_pb2.RouteAction.HashPolicy(
        header=route_components_pb2.RouteAction.HashPolicy.Header(header_name=export.hash_header))]
