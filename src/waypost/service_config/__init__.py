"""gRPC service config (JSON) -> validated, immutable ``ServiceConfig``.

grpcio and grpc-go quietly fall back to pick_first, or to a channel that fails every call, when a
service config has a typo. Here every field is checked and anything invalid raises
``InvalidServiceConfig`` whose message starts with the JSON path of the field, e.g.
``methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2, got 1``.

Semantics follow gRPC (gRFC A2/A6, grpc-go's service config parser):
- ``loadBalancingConfig``: a list of single-key objects; the first policy this library knows wins
  (unknown names before it are skipped with a warning); its config is validated by the policy.
- ``loadBalancingPolicy``: the legacy policy name, case-insensitive; loses to ``loadBalancingConfig``.
- neither: ``DEFAULT_POLICY`` (prequal), unless ``dial(balancer=...)`` names one.
- ``dial(retries=N)``: a retryPolicy on UNAVAILABLE for every method (an error next to the config's own); a
  retryPolicy whose codes lack UNAVAILABLE is logged once as a WARNING (it cannot move a call off a dead backend).
- ``methodConfig``: per-method ``timeout``, ``waitForReady``, and ``retryPolicy`` or ``hedgingPolicy`` (one of
  the two; ``maxAttempts`` is capped at 5 as in gRPC). ``hedgingPolicy`` also takes waypost's adaptive delay
  (``"hedgingDelay": "p95"``) and its cap on extra calls (``maxExtraShare``). The message-size limits are real
  gRPC fields that waypost does not implement: they are rejected with a clear error instead of being ignored.
- ``retryThrottling``: gRPC's token bucket, parsed to a ``RetryThrottling`` value.
- ``healthCheckConfig.serviceName``: the grpc.health.v1 service name to watch per backend.

The result is plain data (``model``); the client runs retries and keeps the token bucket
(``waypost.client.retry``, ``waypost.client.retry_throttle``). Modules: ``parse`` (the entry point and
the load-balancing, methodConfig and health sections), ``retry`` (retryPolicy, retryThrottling), ``hedging``
(hedgingPolicy),
``fields`` (per-field checks), ``jsonvalue`` (JSON loading and freezing), ``model`` (the values).
"""

from __future__ import annotations

from .model import DEFAULT_POLICY, HedgingPolicy, MethodConfig, RetryPolicy, RetryThrottling, ServiceConfig
from .parse import parse_service_config

__all__ = ["DEFAULT_POLICY", "HedgingPolicy", "MethodConfig", "RetryPolicy", "RetryThrottling", "ServiceConfig", "parse_service_config"]
