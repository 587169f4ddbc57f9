"""Service config validation: valid and invalid tables, lookup precedence, durations."""

from __future__ import annotations

import json

import grpc
import pytest

from waypost import InvalidServiceConfig
from waypost.balancer.policies import known_policies
from waypost.durations import DurationError, format_duration, parse_duration, parse_positive_duration
from waypost.service_config import (
    MethodConfig,
    RetryPolicy,
    RetryThrottling,
    parse_service_config,
)

REAL_POLICIES = [
    "pick_first",
    "round_robin",
    "random",
    "smooth_weighted_round_robin",
    "p2c_ewma",
    "least_request",
    "consistent_hash",
    "outlier_detection",
]

RETRY = {
    "maxAttempts": 3,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def with_retry(**changes):
    policy = dict(RETRY)
    for k, v in changes.items():
        if v is None:
            policy.pop(k)
        else:
            policy[k] = v
    return {"methodConfig": [{"name": [{}], "retryPolicy": policy}]}


def test_real_policies_are_registered():
    assert set(REAL_POLICIES) <= set(known_policies())


# ---------------------------------------------------------------------------------------------
# load balancing


@pytest.mark.parametrize(
    ("raw", "balancer", "policy"),
    [
        (None, None, "prequal"),  # waypost's default (DEFAULT_POLICY), the same as dial's
        ({}, None, "prequal"),
        ("", None, None),  # empty text is invalid JSON: see the invalid table
        ({}, "p2c_ewma", "p2c_ewma"),  # go-zero's dial default through the shortcut
        (None, "ROUND_ROBIN", "round_robin"),
        ({"loadBalancingPolicy": "round_robin"}, None, "round_robin"),
        ({"loadBalancingPolicy": "ROUND_ROBIN"}, None, "round_robin"),
        ({"loadBalancingConfig": [{"round_robin": {}}]}, None, "round_robin"),
        # first known policy wins; unknown ones before it are skipped, as gRPC does
        ({"loadBalancingConfig": [{"grpclb": {}}, {"xds_wrr": {}}, {"least_request": {}}]}, None, "least_request"),
        ({"loadBalancingConfig": [{"random": {}}, {"round_robin": {}}]}, None, "random"),
        # loadBalancingConfig wins over the legacy field
        ({"loadBalancingPolicy": "round_robin", "loadBalancingConfig": [{"p2c_ewma": {}}]}, None, "p2c_ewma"),
        # balancer agreeing with the config
        ({"loadBalancingConfig": [{"p2c_ewma": {}}]}, "p2c_ewma", "p2c_ewma"),
        ({"loadBalancingPolicy": "round_robin"}, "round_robin", "round_robin"),
    ],
)
def test_policy_selection(raw, balancer, policy):
    if policy is None:
        with pytest.raises(InvalidServiceConfig):
            parse_service_config(raw, balancer=balancer)
        return
    assert parse_service_config(raw, balancer=balancer).lb_policy == policy


@pytest.mark.parametrize("name", REAL_POLICIES)
def test_every_real_policy_accepts_an_empty_config(name):
    cfg = parse_service_config({"loadBalancingConfig": [{name: {}}]})
    assert cfg.lb_policy == name
    assert parse_service_config(None, balancer=name).lb_policy == name


def test_policy_config_is_validated_by_the_policy():
    cfg = parse_service_config({"loadBalancingConfig": [{"least_request": {"choiceCount": 3}}]})
    assert cfg.lb_config["choiceCount"] == 3
    with pytest.raises(InvalidServiceConfig) as err:
        parse_service_config({"loadBalancingConfig": [{"grpclb": {}}, {"least_request": {"choiceCount": 99}}]})
    assert str(err.value).startswith("loadBalancingConfig[1].least_request.choiceCount:")


def test_nested_child_policy_is_passed_as_plain_json():
    cfg = parse_service_config(
        json.dumps({"loadBalancingConfig": [{"outlier_detection": {"childPolicy": [{"p2c_ewma": {}}]}}]})
    )
    assert cfg.lb_policy == "outlier_detection"
    assert "childPolicy" in cfg.lb_config


def test_skipped_unknown_policies_are_logged(caplog):
    with caplog.at_level("WARNING", logger="waypost.balancer.catalog"):
        parse_service_config({"loadBalancingConfig": [{"round_robn": {}}, {"pick_first": {}}]})
    assert "round_robn" in caplog.text


def test_balancer_disagreeing_with_config_names_both():
    with pytest.raises(InvalidServiceConfig) as err:
        parse_service_config({"loadBalancingConfig": [{"round_robin": {}}]}, balancer="p2c_ewma")
    msg = str(err.value)
    assert msg.startswith("balancer:")
    assert "'p2c_ewma'" in msg and "'round_robin'" in msg and "loadBalancingConfig[0]" in msg


def test_unknown_policy_lists_known_ones():
    for raw, balancer, prefix in [
        ({"loadBalancingConfig": [{"ring_hash_experimental": {}}]}, None, "loadBalancingConfig:"),
        ({"loadBalancingPolicy": "round_robn"}, None, "loadBalancingPolicy:"),
        (None, "p2c", "balancer:"),
    ]:
        with pytest.raises(InvalidServiceConfig) as err:
            parse_service_config(raw, balancer=balancer)
        msg = str(err.value)
        assert msg.startswith(prefix), msg
        for name in REAL_POLICIES:
            assert name in msg


def test_legacy_typo_is_an_error_even_when_load_balancing_config_wins():
    with pytest.raises(InvalidServiceConfig, match=r"^loadBalancingPolicy: unknown .*'round_robn'.*did you mean"):
        parse_service_config({"loadBalancingPolicy": "round_robn", "loadBalancingConfig": [{"random": {}}]})


# ---------------------------------------------------------------------------------------------
# a full config


FULL = """
{
  "loadBalancingConfig": [{"p2c_ewma": {}}],
  "methodConfig": [
    {"name": [{"service": "greet.Greeter", "method": "SayHello"}], "timeout": "1.5s",
     "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.3s",
                     "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted", 4]}},
    {"name": [{"service": "greet.Greeter"}, {"service": "greet.Other", "method": ""}], "waitForReady": true},
    {"name": [{}], "timeout": "10s", "waitForReady": false}
  ],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
  "healthCheckConfig": {"serviceName": "greet.Greeter"}
}
"""


def test_full_config():
    cfg = parse_service_config(FULL)
    assert cfg.lb_policy == "p2c_ewma"
    assert cfg.retry_throttling == RetryThrottling(max_tokens=10.0, token_ratio=0.1)
    assert cfg.health_check_service_name == "greet.Greeter"
    assert len(cfg.method_configs) == 3
    exact = cfg.method_configs[0]
    assert exact.timeout == 1.5
    assert exact.wait_for_ready is None
    assert exact.retry_policy == RetryPolicy(
        max_attempts=4,
        initial_backoff=0.01,
        max_backoff=0.3,
        backoff_multiplier=1.5,
        retryable_status_codes=frozenset(
            {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
        ),
    )
    assert cfg.method_configs[1] == MethodConfig(wait_for_ready=True)
    assert cfg.method_configs[2] == MethodConfig(timeout=10.0, wait_for_ready=False)
    # raw is a read-only copy of the input
    assert cfg.raw["healthCheckConfig"]["serviceName"] == "greet.Greeter"
    with pytest.raises(TypeError):
        cfg.raw["x"] = 1  # type: ignore[index]
    # dict and text give the same result
    assert parse_service_config(json.loads(FULL)) == cfg
    assert parse_service_config(FULL.encode()) == cfg


def test_method_config_lookup_precedence():
    cfg = parse_service_config(FULL)
    exact, service, default = cfg.method_configs
    assert cfg.method_config("/greet.Greeter/SayHello") is exact
    assert cfg.method_config("/greet.Greeter/SayBye") is service
    assert cfg.method_config("/greet.Other/Anything") is service
    assert cfg.method_config("/unrelated.Svc/Call") is default
    assert cfg.method_config("greet.Greeter/SayHello") is exact  # tolerated without the leading slash
    assert cfg.method_config("") is default


def test_method_config_lookup_without_default():
    cfg = parse_service_config({"methodConfig": [{"name": [{"service": "a.S", "method": "M"}], "timeout": "1s"}]})
    assert cfg.method_config("/a.S/M") == MethodConfig(timeout=1.0)
    assert cfg.method_config("/a.S/N") is None
    assert cfg.method_config("/b.S/M") is None
    assert parse_service_config(None).method_config("/a.S/M") is None


def test_service_config_passthrough_and_rebalance():
    cfg = parse_service_config(FULL)
    assert parse_service_config(cfg) is cfg
    with pytest.raises(InvalidServiceConfig, match="^balancer:"):
        parse_service_config(cfg, balancer="round_robin")
    assert parse_service_config(cfg, balancer="p2c_ewma") == cfg


def test_max_attempts_is_capped_at_five():
    cfg = parse_service_config(with_retry(maxAttempts=100))
    assert cfg.method_configs[0].retry_policy is not None
    assert cfg.method_configs[0].retry_policy.max_attempts == 5


def test_status_codes_by_name_any_case_or_number():
    for codes in (["UNAVAILABLE"], ["unavailable"], ["Unavailable"], [14]):
        cfg = parse_service_config(with_retry(retryableStatusCodes=codes))
        policy = cfg.method_configs[0].retry_policy
        assert policy is not None
        assert policy.retryable_status_codes == frozenset({grpc.StatusCode.UNAVAILABLE})
        assert grpc.StatusCode.UNAVAILABLE in policy.retryable_status_codes
        assert grpc.StatusCode.INTERNAL not in policy.retryable_status_codes


def test_empty_health_service_name_means_overall_health():
    assert parse_service_config({"healthCheckConfig": {"serviceName": ""}}).health_check_service_name == ""
    assert parse_service_config({}).health_check_service_name is None


# ---------------------------------------------------------------------------------------------
# the invalid table: (config, start of the message, a fragment of the message)

INVALID = [
    # top level and JSON
    ("", "service config: not valid JSON", "line 1 column 1"),
    ('{"loadBalancingPolicy": "round_robin",\n  "methodConfig": [}', "service config: not valid JSON", "line 2"),
    ("[]", "service config: expected a JSON object", "list"),
    ("42", "service config: expected a JSON object", "42"),
    ('{"a": NaN}', "service config: NaN is not valid JSON", ""),
    ('{"a": Infinity}', "service config: Infinity is not valid JSON", ""),
    ('{"methodConfig": [], "methodConfig": []}', "service config: duplicate key 'methodConfig'", ""),
    (b"\xff\xfe", "service config: not valid UTF-8", ""),
    ({"loadBalancingconfig": []}, "loadBalancingconfig: unknown field", "did you mean 'loadBalancingConfig'"),
    ({"retryThrotling": {}}, "retryThrotling: unknown field", "did you mean 'retryThrottling'"),
    # a policy without settings rejects any field (a typo must not pass silently)
    ({"loadBalancingConfig": [{"round_robin": {"foo": 1}}]}, "loadBalancingConfig[0].round_robin.foo: unknown field",
     "takes no fields"),
    ({"loadBalancingConfig": [{"smooth_weighted_round_robin": {"weight": 1}}]},
     "loadBalancingConfig[0].smooth_weighted_round_robin.weight: unknown field", "takes no fields"),
    ({1: 2}, "service config: object keys must be strings", ""),
    ({"methodConfig": [{"name": [{}], "timeout": float("nan")}]}, "methodConfig[0].timeout: nan", "not a valid JSON"),
    ({"methodConfig": object()}, "methodConfig: object is not a JSON value", ""),
    # loadBalancingConfig / loadBalancingPolicy
    ({"loadBalancingConfig": {}}, "loadBalancingConfig: expected a list", ""),
    ({"loadBalancingConfig": []}, "loadBalancingConfig: expected at least one policy", "round_robin"),
    ({"loadBalancingConfig": ["round_robin"]}, "loadBalancingConfig[0]: expected an object", ""),
    ({"loadBalancingConfig": [{}]}, "loadBalancingConfig[0]: expected exactly one key", "got 0"),
    ({"loadBalancingConfig": [{"round_robin": {}, "pick_first": {}}]}, "loadBalancingConfig[0]: expected exactly one key",
     "got 2"),
    ({"loadBalancingConfig": [{"foo": {}}, {"bar": {}}]}, "loadBalancingConfig: none of the policies ['foo', 'bar']",
     "known policies: consistent_hash"),
    ({"loadBalancingConfig": [{"round_robin": 3}]}, "loadBalancingConfig[0].round_robin:", "object"),
    ({"loadBalancingPolicy": 1}, "loadBalancingPolicy: expected a policy name string", ""),
    ({"loadBalancingPolicy": ""}, "loadBalancingPolicy: expected a policy name string", ""),
    # methodConfig
    ({"methodConfig": {}}, "methodConfig: expected a list", ""),
    ({"methodConfig": [3]}, "methodConfig[0]: expected an object", ""),
    ({"methodConfig": [{"timeout": "1s"}]}, "methodConfig[0].name: missing", ""),
    ({"methodConfig": [{"name": []}]}, "methodConfig[0].name: expected a non-empty list", ""),
    ({"methodConfig": [{"name": {}}]}, "methodConfig[0].name: expected a non-empty list", ""),
    ({"methodConfig": [{"name": ["a.S"]}]}, "methodConfig[0].name[0]: expected an object", ""),
    ({"methodConfig": [{"name": [{"method": "M"}]}]}, "methodConfig[0].name[0]: method 'M' given without a service",
     ""),
    ({"methodConfig": [{"name": [{"service": "", "method": "M"}]}]}, "methodConfig[0].name[0]: method 'M'", ""),
    ({"methodConfig": [{"name": [{"service": 1}]}]}, "methodConfig[0].name[0].service: expected a string", ""),
    ({"methodConfig": [{"name": [{"service": "a.S", "method": None}]}]}, "methodConfig[0].name[0].method:", "null"),
    ({"methodConfig": [{"name": [{"service": "a.S", "methd": "M"}]}]}, "methodConfig[0].name[0].methd: unknown field",
     "did you mean 'method'"),
    ({"methodConfig": [{"name": [{"service": "/a.S/M"}]}]}, "methodConfig[0].name[0]:", "'/'"),
    ({"methodConfig": [{"name": [{}]}, {"name": [{}]}]}, "methodConfig[1].name[0]: duplicate the default name",
     "methodConfig[0].name[0]"),
    ({"methodConfig": [{"name": [{"service": "a.S"}, {"service": "a.S", "method": ""}]}]},
     "methodConfig[0].name[1]: duplicate name 'a.S'", "methodConfig[0].name[0]"),
    ({"methodConfig": [{"name": [{"service": "a.S", "method": "M"}]}, {"name": [{"service": "a.S", "method": "M"}]}]},
     "methodConfig[1].name[0]: duplicate name 'a.S/M'", ""),
    ({"methodConfig": [{"name": [{}], "timeout": "100ms"}]}, "methodConfig[0].timeout: expected a duration", "'100ms'"),
    ({"methodConfig": [{"name": [{}], "timeout": 1.5}]}, "methodConfig[0].timeout: expected a duration", "got 1.5"),
    ({"methodConfig": [{"name": [{}], "timeout": "0s"}]}, "methodConfig[0].timeout: expected a duration > 0s", ""),
    ({"methodConfig": [{"name": [{}], "timeout": "-1s"}]}, "methodConfig[0].timeout: expected a duration > 0s", ""),
    ({"methodConfig": [{"name": [{}], "timeout": "1.0000000001s"}]}, "methodConfig[0].timeout: expected a duration",
     ""),
    ({"methodConfig": [{"name": [{}], "waitForReady": "true"}]}, "methodConfig[0].waitForReady: expected true or false",
     ""),
    ({"methodConfig": [{"name": [{}], "waitForReady": 1}]}, "methodConfig[0].waitForReady: expected true or false", ""),
    ({"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 1}}]},
     "methodConfig[0].hedgingPolicy.maxAttempts: expected an integer >= 2", "got 1"),
    ({"methodConfig": [{"name": [{}], "maxRequestMessageBytes": 10}]}, "methodConfig[0].maxRequestMessageBytes:",
     "not supported"),
    ({"methodConfig": [{"name": [{}], "retrypolicy": {}}]}, "methodConfig[0].retrypolicy: unknown field",
     "did you mean 'retryPolicy'"),
    # retryPolicy
    ({"methodConfig": [{"name": [{}], "retryPolicy": []}]}, "methodConfig[0].retryPolicy: expected an object", ""),
    (with_retry(maxAttempts=1), "methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2, got 1", ""),
    (with_retry(maxAttempts=0), "methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2, got 0", ""),
    (with_retry(maxAttempts=True), "methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2, got true", ""),
    (with_retry(maxAttempts=2.5), "methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2", "2.5"),
    (with_retry(maxAttempts="3"), "methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2", "'3'"),
    (with_retry(maxAttempts=None), "methodConfig[0].retryPolicy.maxAttempts: missing", ""),
    (with_retry(initialBackoff="0s"), "methodConfig[0].retryPolicy.initialBackoff: expected a duration > 0s", ""),
    (with_retry(initialBackoff=None), "methodConfig[0].retryPolicy.initialBackoff: missing", ""),
    (with_retry(maxBackoff="1m"), "methodConfig[0].retryPolicy.maxBackoff: expected a duration", "'1m'"),
    (with_retry(backoffMultiplier=0), "methodConfig[0].retryPolicy.backoffMultiplier: expected a number > 0", "0"),
    (with_retry(backoffMultiplier=-2), "methodConfig[0].retryPolicy.backoffMultiplier: expected a number > 0", ""),
    (with_retry(backoffMultiplier=False), "methodConfig[0].retryPolicy.backoffMultiplier: expected a number > 0",
     "false"),
    (with_retry(backoffMultiplier="2"), "methodConfig[0].retryPolicy.backoffMultiplier: expected a number > 0", ""),
    (with_retry(retryableStatusCodes=[]), "methodConfig[0].retryPolicy.retryableStatusCodes: expected a non-empty list",
     ""),
    (with_retry(retryableStatusCodes="UNAVAILABLE"),
     "methodConfig[0].retryPolicy.retryableStatusCodes: expected a non-empty list", ""),
    (with_retry(retryableStatusCodes=["UNAVAILABLE", "UNAVALIABLE"]),
     "methodConfig[0].retryPolicy.retryableStatusCodes[1]: unknown status code 'UNAVALIABLE'",
     "did you mean 'UNAVAILABLE'"),
    (with_retry(retryableStatusCodes=[17]), "methodConfig[0].retryPolicy.retryableStatusCodes[0]: unknown status code",
     "17"),
    (with_retry(retryableStatusCodes=[True]),
     "methodConfig[0].retryPolicy.retryableStatusCodes[0]: expected a status code name", ""),
    (with_retry(retryableStatusCodes=["OK"]), "methodConfig[0].retryPolicy.retryableStatusCodes[0]: OK is not", ""),
    (with_retry(perAttemptRecvTimeout="1s"), "methodConfig[0].retryPolicy.perAttemptRecvTimeout:", "not supported"),
    (with_retry(maxAttempt=3), "methodConfig[0].retryPolicy.maxAttempt: unknown field", "did you mean 'maxAttempts'"),
    # retryThrottling
    ({"retryThrottling": 10}, "retryThrottling: expected an object", ""),
    ({"retryThrottling": {"maxTokens": 10}}, "retryThrottling.tokenRatio: missing", ""),
    ({"retryThrottling": {"tokenRatio": 0.1}}, "retryThrottling.maxTokens: missing", ""),
    ({"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}, "retryThrottling.maxTokens: expected a number in (0, 1000]",
     "got 0"),
    ({"retryThrottling": {"maxTokens": 1000.5, "tokenRatio": 0.1}}, "retryThrottling.maxTokens: expected a number in",
     "1000.5"),
    ({"retryThrottling": {"maxTokens": True, "tokenRatio": 0.1}}, "retryThrottling.maxTokens: expected a number in",
     "true"),
    ({"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}, "retryThrottling.tokenRatio: expected a number > 0", ""),
    ({"retryThrottling": {"maxTokens": 10, "tokenRatio": float("inf")}}, "retryThrottling.tokenRatio: inf", ""),
    ({"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1, "extra": 1}}, "retryThrottling.extra: unknown field", ""),
    # healthCheckConfig
    ({"healthCheckConfig": "greet"}, "healthCheckConfig: expected an object", ""),
    ({"healthCheckConfig": {}}, "healthCheckConfig.serviceName: missing", ""),
    ({"healthCheckConfig": {"serviceName": None}}, "healthCheckConfig.serviceName: expected a string", "null"),
    ({"healthCheckConfig": {"service_name": "x"}}, "healthCheckConfig.service_name: unknown field", ""),
]


@pytest.mark.parametrize(("raw", "prefix", "fragment"), INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_configs(raw, prefix, fragment):
    with pytest.raises(InvalidServiceConfig) as err:
        parse_service_config(raw)
    msg = str(err.value)
    assert msg.startswith(prefix), msg
    assert fragment in msg, msg


def test_deeply_nested_json_is_refused_cleanly():
    text = '{"loadBalancingConfig": [{"x": ' + "[" * 5000 + "]" * 5000 + "}]}"
    with pytest.raises(InvalidServiceConfig, match="nested too deeply"):
        parse_service_config(text)
    nested: list = []
    for _ in range(200):
        nested = [nested]
    with pytest.raises(InvalidServiceConfig, match="nested too deeply"):
        parse_service_config({"loadBalancingConfig": [{"x": nested}]})


def test_cyclic_dict_is_refused_cleanly():
    cyclic: dict = {}
    cyclic["loadBalancingConfig"] = [{"x": cyclic}]
    with pytest.raises(InvalidServiceConfig, match="nested too deeply"):
        parse_service_config(cyclic)


def test_huge_integer_literal_is_refused_cleanly():
    with pytest.raises(InvalidServiceConfig, match="^service config: not valid JSON"):
        parse_service_config('{"retryThrottling": {"maxTokens": ' + "9" * 5000 + ', "tokenRatio": 1}}')


def test_error_is_a_value_error_too():
    # callers that catch ValueError for bad input keep working
    with pytest.raises(ValueError):
        parse_service_config({"nope": 1})


# ---------------------------------------------------------------------------------------------
# durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("1.5s", 1.5), ("0.1s", 0.1), ("0.000000001s", 1e-9), ("10.000s", 10.0), ("0s", 0.0),
     ("-2.5s", -2.5), ("315576000000s", 315576000000.0), ("007s", 7.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "s", "1", "1.s", ".5s", "1.5S", "1e3s", "100ms", "1m", " 1s", "1s ", "1.0000000001s",
             "315576000001s", "9" * 400 + "s", "+1s", "1,5s", 1, 1.5, True, None, ["1s"]],
)
def test_parse_duration_rejects(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_positive_duration_and_format():
    with pytest.raises(DurationError, match="> 0s"):
        parse_positive_duration("0.000s")
    assert parse_positive_duration("0.25s") == 0.25
    assert [format_duration(s) for s in (1.5, 0.1, 10, 0, 1e-9, -2.5)] == ["1.5s", "0.1s", "10s", "0s", "0.000000001s",
                                                                          "-2.5s"]
    for text in ("1.5s", "0.1s", "10s", "0.000000001s"):
        assert format_duration(parse_duration(text)) == text
