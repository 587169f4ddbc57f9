"""The values a parsed service config is made of: plain, immutable data for the client to act on.

Nothing here runs a retry or holds per-channel state: ``waypost.client.retry`` turns a ``RetryPolicy``
into backoff delays, ``waypost.client.hedging`` runs a ``HedgingPolicy``, and ``waypost.client.retry_throttle`` keeps the token bucket a ``RetryThrottling``
describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import grpc

#: The policy of a channel whose service config names none (no ``loadBalancingConfig``, no
#: ``loadBalancingPolicy``) and that is dialed without ``balancer=``. It is the winner of ``bench/simulate.py``'s
#: 50-backend sweep over eight fleets and of ``bench/load_sweep.py``'s open-loop heterogeneous fleet
#: (docs/policies.md shows both): it balances on the servers' own load (waypost servers send it on every call),
#: and where the servers send none it picks as peak_ewma, which needs nothing from them. gRPC would use
#: pick_first, which sends every call to one backend; go-zero uses p2c_ewma, which stays available by
#: name with go-zero's exact formula.
DEFAULT_POLICY = "prequal"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A validated ``retryPolicy``: at most ``max_attempts`` attempts (the first one included).

    Backoff before retry ``n`` is drawn by the client (``waypost.client.retry.backoff_delay``).
    """

    max_attempts: int
    initial_backoff: float
    max_backoff: float
    backoff_multiplier: float
    retryable_status_codes: frozenset[grpc.StatusCode]


@dataclass(frozen=True, slots=True)
class HedgingPolicy:
    """A validated ``hedgingPolicy`` (gRFC A6, with waypost's additions): up to ``max_attempts`` copies of a
    call (the first one included), the next one sent every hedging delay while none has answered.

    The delay is ``delay`` seconds, or, when ``delay_quantile`` is set (``"hedgingDelay": "p95"``), that
    quantile of the channel's recent latency for the method, never below ``min_delay``, and ``fallback_delay``
    until enough latencies are known. ``max_extra_share``: hedges are at most this share of the channel's
    hedged-method calls. The client runs it (``waypost.client.hedging``).
    """

    max_attempts: int
    delay: float
    non_fatal_status_codes: frozenset[grpc.StatusCode]
    delay_quantile: float | None = None
    min_delay: float = 0.0
    fallback_delay: float = 0.0
    max_extra_share: float = 0.05


@dataclass(frozen=True, slots=True)
class MethodConfig:
    """The per-method settings of one ``methodConfig`` entry (None: not set). At most one of ``retry_policy``
    and ``hedging_policy`` is set (gRFC A6)."""

    timeout: float | None = None
    retry_policy: RetryPolicy | None = None
    wait_for_ready: bool | None = None
    hedging_policy: HedgingPolicy | None = None


@dataclass(frozen=True, slots=True)
class RetryThrottling:
    """A validated ``retryThrottling``; the client keeps one token bucket per channel
    (``waypost.client.retry_throttle.RetryThrottle``)."""

    max_tokens: float
    token_ratio: float


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """A validated service config. ``method_config`` answers the per-call lookup in O(1)."""

    lb_policy: str = DEFAULT_POLICY
    lb_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    method_configs: tuple[MethodConfig, ...] = ()
    retry_throttling: RetryThrottling | None = None
    health_check_service_name: str | None = None
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # name -> config tables; filled by parse_service_config (empty tables: no per-method settings)
    _by_method: Mapping[str, MethodConfig] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )
    _by_service: Mapping[str, MethodConfig] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )
    _default: MethodConfig | None = field(default=None, repr=False, compare=False)
    #: every ``methodConfig[].name`` item as (service, method, JSON path); "" for a part not given
    names: tuple[tuple[str, str, str], ...] = field(default=(), repr=False, compare=False)

    def method_config(self, full_method: str) -> MethodConfig | None:
        """The MethodConfig for ``/package.Service/Method`` per gRPC's precedence.

        Exact ``service``+``method`` match, then a ``service``-only entry, then the default entry
        (``"name": [{}]``), else None.
        """
        found = self._by_method.get(full_method)
        if found is None and full_method[:1] != "/" and self._by_method:
            found = self._by_method.get("/" + full_method)  # tolerate "pkg.Service/Method"
        if found is None and self._by_service:
            found = self._by_service.get(full_method.lstrip("/").partition("/")[0])
        return found if found is not None else self._default
