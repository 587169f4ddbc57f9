"""Everything ``dial`` decides once per channel: target, policy, per-method settings, throttling, health."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..balancer import policies
from ..balancer.base import Policy
from ..resolver import Resolver, ResolverOptions, Subsetter, make_resolver
from ..resolver.subset import DEFAULT_SUBSET_SIZE
from ..resolver.target import Target, parse_target, parse_targets, target_for_registry
from ..service_config import MethodConfig, ServiceConfig, parse_service_config
from .dial_options import DialKeywords, DialOptions
from .hedging import ChannelHedging
from .method_names import MethodNameCheck
from .retry_throttle import RetryThrottle
from .routing import FilteringSubsetter, Routing

if TYPE_CHECKING:
    from ..discovery.store import Registry


@dataclass
class ChannelConfig:
    target: Target
    service_config: ServiceConfig
    policy: Policy
    throttle: RetryThrottle | None
    health_service: str | None
    rng: random.Random
    subsetter: Subsetter | None
    #: metadata_filter / prefer of the dial (None: not in use)
    routing: Routing | None = None
    #: the methodConfig name check (None: the config names no service)
    names: MethodNameCheck | None = field(default=None, repr=False)
    #: the hedged methods' shared state: the extra-share budget and their recent latencies (``client.hedging``)
    hedging: ChannelHedging = field(default_factory=lambda: ChannelHedging(None, time.monotonic), repr=False)

    def method_config(self, full_method: str) -> MethodConfig | None:
        """The method's settings; called once per multicallable (where unused methodConfig names are noticed)."""
        if self.names is not None:
            self.names.saw(full_method)
        return self.service_config.method_config(full_method)

    def make_resolver(self, channel_options: Sequence[tuple[str, Any]] = (), *, blocking: bool = True,
                      report_early: bool = True) -> Resolver:
        """The resolver for this target (``blocking``, ``report_early``: see ``ResolverOptions``)."""
        return make_resolver(self.target, ResolverOptions(self.subsetter, tuple(channel_options), blocking,
                                                          report_early))


def dial_config(what: str, target: str | Sequence[str] | Registry, keywords: DialKeywords
                ) -> tuple[ChannelConfig, DialOptions]:
    """What a dial does before building its channel (``what``: the dial's name, for its errors): the options from
    its keywords, checked, and the channel's config from them and the target."""
    from .. import _fork

    _fork.check_child_can_use_grpc(what)  # a child forked with grpc.aio alive: fail now, not hang
    options = DialOptions.from_keywords(what, keywords)
    return build_config(target, options), options


def build_config(
    target: str | Sequence[str] | Registry,
    options: DialOptions,
    *,
    clock: Callable[[], float] | None = None,
) -> ChannelConfig:
    """Validate everything a dial needs; raises InvalidTarget / InvalidServiceConfig / ValueError.

    ``target`` is a target string, or a registry from ``waypost.connect`` with the service ``options.key``.

    ``options.retries``: the retryPolicy shortcut (``parse_service_config``); ``metadata_filter``, ``prefer``,
    ``min_preferred``: routing by registration metadata (``client.routing``)."""
    from ..errors import InvalidTarget

    key = options.key
    if key is not None:
        if isinstance(target, str):
            raise InvalidTarget("dial: key= goes with a registry object (waypost.connect(url)); a target string "
                                "carries its key itself (etcd:///host:2379?key=greet.rpc)")
        target = target_for_registry(target, key)
    elif isinstance(target, list | tuple):
        t = parse_targets(target)
    elif not isinstance(target, str):
        raise InvalidTarget(f"target must be a string, a list of them (several sources), or a registry from "
                            f"waypost.connect() with key=..., got {type(target).__name__}")
    if isinstance(target, str):
        t = parse_target(target)
    _warn_if_misdialed(t)
    # no policy named: service_config.DEFAULT_POLICY
    sc = parse_service_config(options.service_config, balancer=options.balancer, retries=options.retries)
    routing = Routing.make(options.metadata_filter, options.prefer, options.min_preferred)
    if routing is not None:
        routing.target = t.redacted
    rng = options.rng if options.rng is not None else random.Random()
    cls = policies.get_policy(sc.lb_policy)
    kw: dict[str, Any] = {"rng": random.Random(rng.getrandbits(64))}
    if clock is not None:
        kw["clock"] = clock
    policy = cls(sc.lb_config, **kw)
    size = DEFAULT_SUBSET_SIZE if options.subset_size is None else options.subset_size
    client_id = options.client_id
    subsetter = Subsetter(size, client_id=client_id, seed=rng.getrandbits(32)) if routing is None or \
        routing.filter is None else FilteringSubsetter(routing, size, client_id=client_id, seed=rng.getrandbits(32))
    throttle = RetryThrottle.for_config(sc.retry_throttling)
    return ChannelConfig(
        target=t,
        service_config=sc,
        policy=policy,
        throttle=throttle,
        health_service=sc.health_check_service_name,
        rng=rng,
        subsetter=subsetter,
        routing=routing,
        names=MethodNameCheck.for_config(t.redacted, sc),
        hedging=ChannelHedging(throttle, time.monotonic),
    )


def _warn_if_misdialed(t: Target) -> None:
    """A direct target on a registry's port (``host:2379``: etcd's) dials the registry as a backend: almost
    certainly meant as a target of the registry's kind (a kind's ``misdial`` says which)."""
    from ..errors import warn_config
    from ..kind_table import misdialed

    if t.scheme != "direct":
        return
    for ep in t.endpoints:
        meant = misdialed(ep, probe=False, quote=True)
        if meant:
            warn_config(f"waypost: dial({t.redacted!r}): a direct target dials {ep} as a backend; {meant}")
            return
