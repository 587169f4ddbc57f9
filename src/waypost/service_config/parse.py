"""``parse_service_config``: a service config (dict or JSON text) -> a validated ``ServiceConfig``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..balancer.catalog import PolicyChoice, known_policies_text, parse_lb_config_list, parse_policy_config
from ..balancer.policies import POLICIES  # imported from here so the built-in policies are registered
from ..errors import describe_value, did_you_mean
from .fields import boolean, check_fields, duration, fail
from .hedging import parse_hedging_policy
from .jsonvalue import freeze, load_json, normalize
from .model import DEFAULT_POLICY, MethodConfig, RetryPolicy, ServiceConfig
from .retry import parse_retry_policy, parse_throttling, shortcut_retry_policy

_TOP_FIELDS = ("loadBalancingPolicy", "loadBalancingConfig", "methodConfig", "retryThrottling", "healthCheckConfig")
_METHOD_FIELDS = ("name", "timeout", "waitForReady", "retryPolicy", "hedgingPolicy")
_METHOD_UNSUPPORTED = ("maxRequestMessageBytes", "maxResponseMessageBytes")
_NAME_FIELDS = ("service", "method")
_HEALTH_FIELDS = ("serviceName",)


def _optional(entry: dict[str, Any], path: str, name: str, parse: Callable[[Any, str], Any]) -> Any:
    """``entry[name]`` parsed, or None when the field is absent."""
    return parse(entry[name], f"{path}.{name}") if name in entry else None


def parse_service_config(
    raw: Mapping[str, Any] | str | bytes | ServiceConfig | None, *, balancer: str | None = None,
    retries: int | None = None,
) -> ServiceConfig:
    """Validate a gRPC service config given as a dict or JSON text; None means an empty config.

    ``balancer`` is the dial shortcut: a policy name used when the config names none; if the
    config names a different policy the two disagree and an error says both. With neither, the
    policy is ``DEFAULT_POLICY`` (prequal), the same one ``waypost.dial`` uses.
    ``retries`` is the other dial shortcut: a retryPolicy of ``retries`` retries on UNAVAILABLE for every
    method (``retry.shortcut_retry_policy``); a config with a retryPolicy of its own is then an error.
    Raises ``InvalidServiceConfig`` whose message starts with the JSON path of the bad field.
    """
    if isinstance(raw, ServiceConfig):
        if balancer is None and retries is None:
            return raw
        raw = raw.raw
    if raw is None:
        doc: Any = {}
    elif isinstance(raw, (str, bytes, bytearray)):
        doc = load_json(raw)
    else:
        doc = raw
    doc = normalize(doc, "service config", 0)
    if not isinstance(doc, dict):
        fail("service config", f"expected a JSON object, got {describe_value(doc)}")
    check_fields(doc, "", _TOP_FIELDS, ())

    lb_policy, lb_config = _parse_lb(doc, balancer)
    by_method: dict[str, MethodConfig] = {}
    by_service: dict[str, MethodConfig] = {}
    default: MethodConfig | None = None
    method_configs: list[MethodConfig] = []
    names: list[tuple[str, str, str]] = []
    if "methodConfig" in doc:
        method_configs, by_method, by_service, default = _parse_method_configs(doc["methodConfig"], names)
    shortcut = shortcut_retry_policy(retries)
    if shortcut is not None:
        method_configs, by_method, by_service, default = _with_retry(shortcut, method_configs, by_method,
                                                                     by_service, default)
    throttling = parse_throttling(doc["retryThrottling"]) if "retryThrottling" in doc else None
    health = _parse_health(doc["healthCheckConfig"]) if "healthCheckConfig" in doc else None

    return ServiceConfig(
        lb_policy=lb_policy,
        lb_config=MappingProxyType(lb_config),
        method_configs=tuple(method_configs),
        retry_throttling=throttling,
        health_check_service_name=health,
        raw=freeze(doc),
        _by_method=MappingProxyType(by_method),
        _by_service=MappingProxyType(by_service),
        _default=default,
        names=tuple(names),
    )


def _with_retry(
    policy: RetryPolicy, configs: list[MethodConfig], by_method: dict[str, MethodConfig],
    by_service: dict[str, MethodConfig], default: MethodConfig | None,
) -> tuple[list[MethodConfig], dict[str, MethodConfig], dict[str, MethodConfig], MethodConfig | None]:
    """``dial(retries=N)``: ``policy`` for every method. It is an error next to a retryPolicy of the config's
    own: two retry settings for the same methods, and neither would be obviously the one that applies."""
    for i, mc in enumerate(configs):
        if mc.retry_policy is not None:
            fail("retries", f"dial(retries=...) sets a retryPolicy for every method, and methodConfig[{i}] has "
                  "its own retryPolicy; give retries in one place (drop retries=, or that retryPolicy)")
        if mc.hedging_policy is not None:
            fail("retries", f"dial(retries=...) sets a retryPolicy for every method, and methodConfig[{i}] has a "
                  "hedgingPolicy (a method has one or the other, gRFC A6); drop retries= and give retryPolicy "
                  "to the other methods in the service config")
    swap = {id(mc): replace(mc, retry_policy=policy) for mc in configs}
    return ([swap[id(mc)] for mc in configs], {k: swap[id(v)] for k, v in by_method.items()},
            {k: swap[id(v)] for k, v in by_service.items()},
            swap[id(default)] if default is not None else MethodConfig(retry_policy=policy))


def _parse_lb(doc: dict[str, Any], balancer: str | None) -> tuple[str, dict[str, Any]]:
    """(policy name, validated policy config) from the config and the ``balancer`` shortcut."""
    chosen: PolicyChoice | None = None
    if "loadBalancingConfig" in doc:
        chosen = parse_lb_config_list(doc["loadBalancingConfig"], "loadBalancingConfig")
    if "loadBalancingPolicy" in doc:
        # Validated even when loadBalancingConfig wins: a typo must never be silent.
        legacy = _policy_name(doc["loadBalancingPolicy"], "loadBalancingPolicy")
        if chosen is None:
            config = parse_policy_config(legacy, None, "loadBalancingPolicy")
            chosen = PolicyChoice(legacy, config, "loadBalancingPolicy")
    if balancer is not None:
        wanted = _policy_name(balancer, "balancer")
        if chosen is None:
            return wanted, parse_policy_config(wanted, None, "balancer")
        if chosen.name != wanted:
            fail(
                "balancer",
                f"balancer={wanted!r} disagrees with the service config's {chosen.path} policy {chosen.name!r}; "
                "name the policy in one place or make them agree",
            )
    if chosen is None:
        if DEFAULT_POLICY not in POLICIES:
            fail("loadBalancingConfig", f"no policy given and the default {DEFAULT_POLICY!r} is not registered"
                  f"; known policies: {known_policies_text()}")
        return DEFAULT_POLICY, parse_policy_config(DEFAULT_POLICY, None, "loadBalancingConfig")
    return chosen.name, chosen.config


def _policy_name(value: object, path: str) -> str:
    """A legacy/shortcut policy name: case-insensitive, must be registered."""
    if not isinstance(value, str) or not value:
        fail(path, f"expected a policy name string, got {describe_value(value)}")
    if value in POLICIES:
        return value
    lowered = value.lower()
    if lowered in POLICIES:
        return lowered
    fail(path, f"unknown load-balancing policy {value!r}{did_you_mean(lowered, POLICIES)}; "
          f"known policies: {known_policies_text()}")


def _parse_method_configs(
    value: object, all_names: list[tuple[str, str, str]],
) -> tuple[list[MethodConfig], dict[str, MethodConfig], dict[str, MethodConfig], MethodConfig | None]:
    path = "methodConfig"
    if not isinstance(value, list):
        fail(path, f"expected a list of method config objects, got {describe_value(value)}")
    configs: list[MethodConfig] = []
    by_method: dict[str, MethodConfig] = {}
    by_service: dict[str, MethodConfig] = {}
    default: MethodConfig | None = None
    seen: dict[tuple[str, str], str] = {}  # (service, method) -> path of its first mention
    for i, entry in enumerate(value):
        entry_path = f"{path}[{i}]"
        if not isinstance(entry, dict):
            fail(entry_path, f"expected an object, got {describe_value(entry)}")
        check_fields(entry, entry_path, _METHOD_FIELDS, _METHOD_UNSUPPORTED)
        names = _parse_names(entry.get("name"), "name" in entry, f"{entry_path}.name", seen)
        all_names.extend((service, method, f"{entry_path}.name[{j}]") for j, (service, method) in enumerate(names))
        if "retryPolicy" in entry and "hedgingPolicy" in entry:
            fail(entry_path, "retryPolicy and hedgingPolicy both given: a method is retried or hedged, not both "
                 "(gRFC A6); keep one")
        mc = MethodConfig(timeout=_optional(entry, entry_path, "timeout", duration),
                          retry_policy=_optional(entry, entry_path, "retryPolicy", parse_retry_policy),
                          wait_for_ready=_optional(entry, entry_path, "waitForReady", boolean),
                          hedging_policy=_optional(entry, entry_path, "hedgingPolicy", parse_hedging_policy))
        configs.append(mc)
        for service, method in names:
            if not service:
                default = mc
            elif not method:
                by_service[service] = mc
            else:
                by_method[f"/{service}/{method}"] = mc
    return configs, by_method, by_service, default


def _parse_names(
    value: object, present: bool, path: str, seen: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    if not present:
        fail(path, 'missing: each methodConfig needs a "name" list ([{}] for the default config)')
    if not isinstance(value, list) or not value:
        fail(path, f'expected a non-empty list of {{"service", "method"}} objects, got {describe_value(value)}')
    names = []
    for j, item in enumerate(value):
        item_path = f"{path}[{j}]"
        if not isinstance(item, dict):
            fail(item_path, f"expected an object with service/method, got {describe_value(item)}")
        check_fields(item, item_path, _NAME_FIELDS, ())
        service = item.get("service", "")
        method = item.get("method", "")
        if not isinstance(service, str):
            fail(f"{item_path}.service", f"expected a string, got {describe_value(service)}")
        if not isinstance(method, str):
            fail(f"{item_path}.method", f"expected a string, got {describe_value(method)}")
        if method and not service:
            fail(item_path, f"method {method!r} given without a service (only the default entry may omit service)")
        if "/" in service or "/" in method:
            fail(item_path, "service and method names must not contain '/' (write service and method separately)")
        key = (service, method)
        if key in seen:
            what = "the default name {}" if not service else f"name {service + ('/' + method if method else '')!r}"
            fail(item_path, f"duplicate {what}, already given at {seen[key]}")
        seen[key] = item_path
        names.append(key)
    return names


def _parse_health(value: object) -> str:
    path = "healthCheckConfig"
    if not isinstance(value, dict):
        fail(path, f"expected an object, got {describe_value(value)}")
    check_fields(value, path, _HEALTH_FIELDS, ())
    if "serviceName" not in value:
        fail(f"{path}.serviceName", 'missing (use "" for the server\'s overall health)')
    name = value["serviceName"]
    if not isinstance(name, str):
        fail(f"{path}.serviceName", f"expected a string, got {describe_value(name)}")
    return name
