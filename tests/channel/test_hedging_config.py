"""``hedgingPolicy`` in the service config: gRFC A6's fields as grpc-java reads them, waypost's additions, the
exclusion with retryPolicy, and the errors for bad values."""

from __future__ import annotations

import json

import grpc
import pytest

from waypost.errors import InvalidServiceConfig
from waypost.service_config import HedgingPolicy, parse_service_config

# grpc-java's hedging example config (examples/.../hedging/hedging_service_config.json), as grpc-java writes it
GRPC_JAVA_EXAMPLE = """
{
  "methodConfig": [
    {
      "name": [
        {
          "service": "helloworld.Greeter",
          "method": "SayHello"
        }
      ],

      "hedgingPolicy": {
        "maxAttempts": 3,
        "hedgingDelay": "1s"
      }
    }
  ],

  "retryThrottling": {
    "maxTokens": 10,
    "tokenRatio": 0.1
  }
}
"""


def _policy(**fields: object) -> HedgingPolicy:
    cfg = parse_service_config({"methodConfig": [{"name": [{}], "hedgingPolicy": fields}]})
    mc = cfg.method_config("/a.S/M")
    assert mc is not None and mc.hedging_policy is not None and mc.retry_policy is None
    return mc.hedging_policy


def test_grpc_java_example_parses_unchanged():
    cfg = parse_service_config(GRPC_JAVA_EXAMPLE)
    mc = cfg.method_config("/helloworld.Greeter/SayHello")
    assert mc is not None
    assert mc.hedging_policy == HedgingPolicy(max_attempts=3, delay=1.0, non_fatal_status_codes=frozenset(),
                                              min_delay=0.001, fallback_delay=0.1)
    assert cfg.retry_throttling is not None and cfg.retry_throttling.max_tokens == 10
    assert cfg.method_config("/helloworld.Greeter/Other") is None


def test_a6_example_fields():
    p = _policy(maxAttempts=4, hedgingDelay="0.5s", nonFatalStatusCodes=["UNAVAILABLE", "INTERNAL", "ABORTED"])
    assert (p.max_attempts, p.delay, p.delay_quantile) == (4, 0.5, None)
    assert p.non_fatal_status_codes == {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                        grpc.StatusCode.ABORTED}
    assert p.max_extra_share == 0.05  # waypost's default cap
    assert _policy(maxAttempts=4, nonFatalStatusCodes=[14]).delay == 0.0  # A6: unset means every attempt at once


def test_max_attempts_capped_at_five():
    assert _policy(maxAttempts=9, hedgingDelay="0s").max_attempts == 5


def test_adaptive_delay_and_extra_share():
    p = _policy(maxAttempts=2, hedgingDelay="p95", minHedgingDelay="0.002s", fallbackHedgingDelay="0.03s",
                maxExtraShare=0.1)
    assert (p.delay_quantile, p.min_delay, p.fallback_delay, p.max_extra_share) == (0.95, 0.002, 0.03, 0.1)
    assert _policy(maxAttempts=2, hedgingDelay="p99.9").delay_quantile == pytest.approx(0.999)


def test_retry_and_hedging_policy_are_exclusive():
    retry = {"maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
             "retryableStatusCodes": ["UNAVAILABLE"]}
    with pytest.raises(InvalidServiceConfig, match=r"methodConfig\[0\]: retryPolicy and hedgingPolicy both given"):
        parse_service_config({"methodConfig": [{"name": [{}], "retryPolicy": retry,
                                                "hedgingPolicy": {"maxAttempts": 2}}]})
    with pytest.raises(InvalidServiceConfig, match=r"retries: .*methodConfig\[0\] has a hedgingPolicy"):
        parse_service_config({"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}]}, retries=2)
    # one method retried, another hedged: fine
    cfg = parse_service_config({"methodConfig": [
        {"name": [{"service": "a.S", "method": "R"}], "retryPolicy": retry},
        {"name": [{"service": "a.S", "method": "H"}], "hedgingPolicy": {"maxAttempts": 2}}]})
    assert cfg.method_config("/a.S/R").retry_policy is not None  # type: ignore[union-attr]
    assert cfg.method_config("/a.S/H").hedging_policy is not None  # type: ignore[union-attr]


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "hedgingPolicy.maxAttempts: missing"),
    ({"maxAttempts": 1}, "hedgingPolicy.maxAttempts: expected an integer >= 2, got 1"),
    ({"maxAttempts": "3"}, "hedgingPolicy.maxAttempts: expected an integer >= 2"),
    ({"maxAttempts": 2, "hedgingDelay": "-1s"}, "hedgingPolicy.hedgingDelay:"),
    ({"maxAttempts": 2, "hedgingDelay": "500ms"}, "hedgingPolicy.hedgingDelay: expected a duration"),
    ({"maxAttempts": 2, "hedgingDelay": "p40"}, 'hedgingPolicy.hedgingDelay: expected a quantile from "p50"'),
    ({"maxAttempts": 2, "hedgingDelay": "pmax"}, 'hedgingPolicy.hedgingDelay: expected a quantile like "p95"'),
    ({"maxAttempts": 2, "nonFatalStatusCodes": ["OK"]}, "nonFatalStatusCodes[0]: OK is not a non-fatal status code"),
    ({"maxAttempts": 2, "nonFatalStatusCodes": ["UNAVAIL"]}, "nonFatalStatusCodes[0]: unknown status code"),
    ({"maxAttempts": 2, "nonFatalStatusCodes": "UNAVAILABLE"}, "nonFatalStatusCodes: expected a list"),
    ({"maxAttempts": 2, "maxExtraShare": 1.5}, "hedgingPolicy.maxExtraShare: expected a number in [0, 1]"),
    ({"maxAttempts": 2, "maxExtraShare": "5%"}, "hedgingPolicy.maxExtraShare: expected a number"),
    ({"maxAttempts": 2, "minHedgingDelay": "0.01s"}, "hedgingPolicy.minHedgingDelay: applies only to an adaptive"),
    ({"maxAttempts": 2, "hedgingdelay": "1s"}, "hedgingPolicy.hedgingdelay: unknown field"),
    ({"maxAttempts": 2, "perAttemptRecvTimeout": "1s"}, "hedgingPolicy.perAttemptRecvTimeout: unknown field"),
])
def test_bad_values_name_the_field(fields, message):
    with pytest.raises(InvalidServiceConfig) as err:
        parse_service_config(json.dumps({"methodConfig": [{"name": [{}], "hedgingPolicy": fields}]}))
    assert str(err.value).startswith("methodConfig[0].") and message in str(err.value), str(err.value)
