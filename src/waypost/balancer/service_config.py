"""gRPC service config (JSON) -> validated, immutable ``ServiceConfig``.

grpcio and grpc-go quietly fall back to pick_first, or to a channel that fails every call, when a
service config has a typo. Here every field is checked and anything invalid raises
``InvalidServiceConfig`` whose message starts with the JSON path of the field, e.g.
``methodConfig[0].retryPolicy.maxAttempts: expected an integer >= 2, got 1``.

Semantics follow gRPC (gRFC A2/A6, grpc-go's service config parser):
- ``loadBalancingConfig``: a list of single-key objects; the first policy this library knows wins
  (unknown names before it are skipped with a warning); its config is validated by the policy.
- ``loadBalancingPolicy``: the legacy policy name, case-insensitive; loses to ``loadBalancingConfig``.
- ``methodConfig``: per-method ``timeout``, ``waitForReady`` and ``retryPolicy`` (``maxAttempts`` is capped
  at 5 as in gRPC). ``hedgingPolicy`` and the message-size limits are real gRPC fields that waypost
  does not implement: they are rejected with a clear error instead of being ignored.
- ``retryThrottling``: gRPC's token bucket (``RetryThrottle``, in ``retry_throttle``, holds its state).
- ``healthCheckConfig.serviceName``: the grpc.health.v1 service name to watch per backend.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn, Protocol

import grpc

from ..durations import DurationError, parse_positive_duration
from ..errors import InvalidServiceConfig
from .catalog import PolicyChoice, known_policies_text, parse_lb_config_list, parse_policy_config
from .policies import POLICIES
from .retry_throttle import RetryThrottle  # re-exported: the per-channel state of a RetryThrottling

log = logging.getLogger("waypost.balancer.service_config")

#: gRPC's default policy when a config names none (go-zero's dial passes p2c_ewma via ``balancer``)
DEFAULT_POLICY = "pick_first"
#: gRPC caps retryPolicy.maxAttempts at 5 (larger values are accepted and lowered)
MAX_ATTEMPTS_CAP = 5
#: gRPC's upper bound for retryThrottling.maxTokens
MAX_TOKENS_LIMIT = 1000
#: JSON nesting deeper than this is refused (service configs are a few levels deep)
MAX_DEPTH = 64

_TOP_FIELDS = ("loadBalancingPolicy", "loadBalancingConfig", "methodConfig", "retryThrottling", "healthCheckConfig")
_METHOD_FIELDS = ("name", "timeout", "waitForReady", "retryPolicy")
_METHOD_UNSUPPORTED = ("hedgingPolicy", "maxRequestMessageBytes", "maxResponseMessageBytes")
_NAME_FIELDS = ("service", "method")
_RETRY_FIELDS = ("maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes")
_RETRY_UNSUPPORTED = ("perAttemptRecvTimeout",)
_THROTTLE_FIELDS = ("maxTokens", "tokenRatio")
_UNSUPPORTED_WHY = {
    "hedgingPolicy": "hedging is not supported by waypost; use retryPolicy",
    "maxRequestMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_send_message_length channel option",
    "maxResponseMessageBytes": "per-method message size limits are not supported by waypost; "
    "use the grpc.max_receive_message_length channel option",
    "perAttemptRecvTimeout": "per-attempt receive timeouts are not supported by waypost",
}
_HEALTH_FIELDS = ("serviceName",)

_CODES_BY_NAME = {code.name: code for code in grpc.StatusCode}
_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class Rng(Protocol):
    """The part of ``random.Random`` that backoff needs."""

    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A validated ``retryPolicy``: at most ``max_attempts`` attempts (the first one included)."""

    max_attempts: int
    initial_backoff: float
    max_backoff: float
    backoff_multiplier: float
    retryable_status_codes: frozenset[grpc.StatusCode]

    def backoff(self, attempt: int, rng: Rng) -> float:
        """Seconds to wait before retry number ``attempt`` (1 = the first retry).

        gRPC's jittered exponential backoff: uniform in
        ``[0, min(initial_backoff * backoff_multiplier ** (attempt - 1), max_backoff)]``.
        """
        if attempt < 1:
            raise ValueError(f"retry attempt numbers start at 1, got {attempt}")
        try:
            grown = self.initial_backoff * self.backoff_multiplier ** (attempt - 1)
        except OverflowError:  # a huge multiplier ** attempt: the cap applies anyway
            grown = math.inf
        return rng.uniform(0.0, min(grown, self.max_backoff))

    def is_retryable(self, code: grpc.StatusCode) -> bool:
        return code in self.retryable_status_codes


@dataclass(frozen=True, slots=True)
class MethodConfig:
    """The per-method settings of one ``methodConfig`` entry (None: not set)."""

    timeout: float | None = None
    retry_policy: RetryPolicy | None = None
    wait_for_ready: bool | None = None


@dataclass(frozen=True, slots=True)
class RetryThrottling:
    """A validated ``retryThrottling``; make one ``RetryThrottle`` per channel from it."""

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

    def new_retry_throttle(self) -> RetryThrottle | None:
        """A fresh token bucket for a channel, or None when the config sets no throttling."""
        return RetryThrottle(self.retry_throttling) if self.retry_throttling is not None else None


# ---------------------------------------------------------------------------------------------
# parsing


def parse_service_config(
    raw: Mapping[str, Any] | str | bytes | ServiceConfig | None, *, balancer: str | None = None
) -> ServiceConfig:
    """Validate a gRPC service config given as a dict or JSON text; None means an empty config.

    ``balancer`` is the dial shortcut: a policy name used when the config names none; if the
    config names a different policy the two disagree and an error says both. With neither, the
    policy is ``pick_first`` (gRPC's default).
    Raises ``InvalidServiceConfig`` whose message starts with the JSON path of the bad field.
    """
    if isinstance(raw, ServiceConfig):
        if balancer is None:
            return raw
        raw = raw.raw
    if raw is None:
        doc: Any = {}
    elif isinstance(raw, (str, bytes, bytearray)):
        doc = _load_json(raw)
    else:
        doc = raw
    doc = _normalize(doc, "service config", 0)
    if not isinstance(doc, dict):
        _fail("service config", f"expected a JSON object, got {_describe(doc)}")
    _check_fields(doc, "", _TOP_FIELDS, ())

    lb_policy, lb_config = _parse_lb(doc, balancer)
    by_method: dict[str, MethodConfig] = {}
    by_service: dict[str, MethodConfig] = {}
    default: MethodConfig | None = None
    method_configs: list[MethodConfig] = []
    if "methodConfig" in doc:
        method_configs, by_method, by_service, default = _parse_method_configs(doc["methodConfig"])
    throttling = _parse_throttling(doc["retryThrottling"]) if "retryThrottling" in doc else None
    health = _parse_health(doc["healthCheckConfig"]) if "healthCheckConfig" in doc else None

    return ServiceConfig(
        lb_policy=lb_policy,
        lb_config=MappingProxyType(lb_config),
        method_configs=tuple(method_configs),
        retry_throttling=throttling,
        health_check_service_name=health,
        raw=_freeze(doc),
        _by_method=MappingProxyType(by_method),
        _by_service=MappingProxyType(by_service),
        _default=default,
    )


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
            _fail(
                "balancer",
                f"balancer={wanted!r} disagrees with the service config's {chosen.path} policy {chosen.name!r}; "
                "name the policy in one place or make them agree",
            )
    if chosen is None:
        if DEFAULT_POLICY not in POLICIES:
            _fail("loadBalancingConfig", f"no policy given and the default {DEFAULT_POLICY!r} is not registered"
                  f"; known policies: {known_policies_text()}")
        return DEFAULT_POLICY, parse_policy_config(DEFAULT_POLICY, None, "loadBalancingConfig")
    return chosen.name, chosen.config


def _policy_name(value: Any, path: str) -> str:
    """A legacy/shortcut policy name: case-insensitive, must be registered."""
    if not isinstance(value, str) or not value:
        _fail(path, f"expected a policy name string, got {_describe(value)}")
    if value in POLICIES:
        return value
    lowered = value.lower()
    if lowered in POLICIES:
        return lowered
    _fail(path, f"unknown load-balancing policy {value!r}{_did_you_mean(lowered, POLICIES)}; "
          f"known policies: {known_policies_text()}")


def _parse_method_configs(
    value: Any,
) -> tuple[list[MethodConfig], dict[str, MethodConfig], dict[str, MethodConfig], MethodConfig | None]:
    path = "methodConfig"
    if not isinstance(value, list):
        _fail(path, f"expected a list of method config objects, got {_describe(value)}")
    configs: list[MethodConfig] = []
    by_method: dict[str, MethodConfig] = {}
    by_service: dict[str, MethodConfig] = {}
    default: MethodConfig | None = None
    seen: dict[tuple[str, str], str] = {}  # (service, method) -> path of its first mention
    for i, entry in enumerate(value):
        entry_path = f"{path}[{i}]"
        if not isinstance(entry, dict):
            _fail(entry_path, f"expected an object, got {_describe(entry)}")
        _check_fields(entry, entry_path, _METHOD_FIELDS, _METHOD_UNSUPPORTED)
        names = _parse_names(entry.get("name"), "name" in entry, f"{entry_path}.name", seen)
        timeout = None
        if "timeout" in entry:
            timeout = _duration(entry["timeout"], f"{entry_path}.timeout")
        wait_for_ready = None
        if "waitForReady" in entry:
            wait_for_ready = _bool(entry["waitForReady"], f"{entry_path}.waitForReady")
        retry = None
        if "retryPolicy" in entry:
            retry = _parse_retry_policy(entry["retryPolicy"], f"{entry_path}.retryPolicy")
        mc = MethodConfig(timeout=timeout, retry_policy=retry, wait_for_ready=wait_for_ready)
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
    value: Any, present: bool, path: str, seen: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    if not present:
        _fail(path, 'missing: each methodConfig needs a "name" list ([{}] for the default config)')
    if not isinstance(value, list) or not value:
        _fail(path, f'expected a non-empty list of {{"service", "method"}} objects, got {_describe(value)}')
    names = []
    for j, item in enumerate(value):
        item_path = f"{path}[{j}]"
        if not isinstance(item, dict):
            _fail(item_path, f"expected an object with service/method, got {_describe(item)}")
        _check_fields(item, item_path, _NAME_FIELDS, ())
        service = item.get("service", "")
        method = item.get("method", "")
        if not isinstance(service, str):
            _fail(f"{item_path}.service", f"expected a string, got {_describe(service)}")
        if not isinstance(method, str):
            _fail(f"{item_path}.method", f"expected a string, got {_describe(method)}")
        if method and not service:
            _fail(item_path, f"method {method!r} given without a service (only the default entry may omit service)")
        if "/" in service or "/" in method:
            _fail(item_path, "service and method names must not contain '/' (write service and method separately)")
        key = (service, method)
        if key in seen:
            what = "the default name {}" if not service else f"name {service + ('/' + method if method else '')!r}"
            _fail(item_path, f"duplicate {what}, already given at {seen[key]}")
        seen[key] = item_path
        names.append(key)
    return names


def _parse_retry_policy(value: Any, path: str) -> RetryPolicy:
    if not isinstance(value, dict):
        _fail(path, f"expected an object, got {_describe(value)}")
    _check_fields(value, path, _RETRY_FIELDS, _RETRY_UNSUPPORTED)
    for name in _RETRY_FIELDS:
        if name not in value:
            _fail(f"{path}.{name}", "missing (a retryPolicy needs maxAttempts, initialBackoff, maxBackoff, "
                  "backoffMultiplier and retryableStatusCodes)")
    attempts_path = f"{path}.maxAttempts"
    attempts = value["maxAttempts"]
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 2:
        _fail(attempts_path, f"expected an integer >= 2, got {_describe(attempts)}")
    if attempts > MAX_ATTEMPTS_CAP:
        log.debug("%s: %d capped at %d as gRPC does", attempts_path, attempts, MAX_ATTEMPTS_CAP)
        attempts = MAX_ATTEMPTS_CAP
    initial = _duration(value["initialBackoff"], f"{path}.initialBackoff")
    maximum = _duration(value["maxBackoff"], f"{path}.maxBackoff")
    multiplier = _positive_number(value["backoffMultiplier"], f"{path}.backoffMultiplier")
    codes = _status_codes(value["retryableStatusCodes"], f"{path}.retryableStatusCodes")
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=initial,
        max_backoff=maximum,
        backoff_multiplier=multiplier,
        retryable_status_codes=codes,
    )


def _status_codes(value: Any, path: str) -> frozenset[grpc.StatusCode]:
    if not isinstance(value, list) or not value:
        _fail(path, f'expected a non-empty list of status codes like ["UNAVAILABLE"], got {_describe(value)}')
    codes = set()
    for k, item in enumerate(value):
        item_path = f"{path}[{k}]"
        code: grpc.StatusCode | None
        if isinstance(item, str):
            code = _CODES_BY_NAME.get(item.upper())
            if code is None:
                _fail(item_path, f"unknown status code {item!r}{_did_you_mean(item.upper(), _CODES_BY_NAME)}")
        elif isinstance(item, int) and not isinstance(item, bool):
            code = _CODES_BY_NUMBER.get(item)
            if code is None:
                _fail(item_path, f"unknown status code number {item} (expected 1..16)")
        else:
            _fail(item_path, f'expected a status code name like "UNAVAILABLE" or a number, got {_describe(item)}')
        if code is grpc.StatusCode.OK:
            _fail(item_path, "OK is not a retryable status code (retries follow failures)")
        codes.add(code)
    return frozenset(codes)


def _parse_throttling(value: Any) -> RetryThrottling:
    path = "retryThrottling"
    if not isinstance(value, dict):
        _fail(path, f"expected an object, got {_describe(value)}")
    _check_fields(value, path, _THROTTLE_FIELDS, ())
    for name in _THROTTLE_FIELDS:
        if name not in value:
            _fail(f"{path}.{name}", "missing (retryThrottling needs maxTokens and tokenRatio)")
    max_tokens = _number(value["maxTokens"], f"{path}.maxTokens", f"a number in (0, {MAX_TOKENS_LIMIT}]")
    if not 0 < max_tokens <= MAX_TOKENS_LIMIT:
        _fail(f"{path}.maxTokens", f"expected a number in (0, {MAX_TOKENS_LIMIT}], got {_describe(max_tokens)}")
    ratio = _positive_number(value["tokenRatio"], f"{path}.tokenRatio")
    return RetryThrottling(max_tokens=float(max_tokens), token_ratio=float(ratio))


def _parse_health(value: Any) -> str:
    path = "healthCheckConfig"
    if not isinstance(value, dict):
        _fail(path, f"expected an object, got {_describe(value)}")
    _check_fields(value, path, _HEALTH_FIELDS, ())
    if "serviceName" not in value:
        _fail(f"{path}.serviceName", 'missing (use "" for the server\'s overall health)')
    name = value["serviceName"]
    if not isinstance(name, str):
        _fail(f"{path}.serviceName", f"expected a string, got {_describe(name)}")
    return name


# ---------------------------------------------------------------------------------------------
# primitives


def _fail(path: str, message: str) -> NoReturn:
    raise InvalidServiceConfig(f"{path}: {message}" if path else message)


def _check_fields(obj: dict[str, Any], path: str, known: tuple[str, ...], unsupported: tuple[str, ...]) -> None:
    for name in obj:
        if name in known:
            continue
        where = f"{path}.{name}" if path else name
        if name in unsupported:
            _fail(where, _UNSUPPORTED_WHY.get(name, "a gRPC service-config field waypost does not support")
                  + " (remove it)")
        _fail(where, f"unknown field{_did_you_mean(name, known)}; expected one of: {', '.join(known)}")


def _did_you_mean(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _number(value: Any, path: str, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(path, f"expected {expected}, got {_describe(value)}")
    if not math.isfinite(value):
        _fail(path, f"expected {expected}, got {value}")
    return value


def _positive_number(value: Any, path: str) -> float:
    number = _number(value, path, "a number > 0")
    if number <= 0:
        _fail(path, f"expected a number > 0, got {_describe(number)}")
    return float(number)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"expected true or false, got {_describe(value)}")
    return value


def _duration(value: Any, path: str) -> float:
    try:
        return parse_positive_duration(value)
    except DurationError as exc:
        _fail(path, str(exc))


def _describe(value: Any) -> str:
    """A short description of a JSON value for messages (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, str):
        text = repr(value)
        return f"string {text}" if len(text) <= 60 else f"string {text[:57]}..."
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ---------------------------------------------------------------------------------------------
# JSON loading and normalisation


def _load_json(text: str | bytes | bytearray) -> Any:
    def no_constants(name: str) -> NoReturn:
        _fail("service config", f"{name} is not valid JSON (numbers must be finite)")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, val in pairs:
            if key in obj:
                _fail("service config", f"duplicate key {key!r} in a JSON object")
            obj[key] = val
        return obj

    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        _fail("service config", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except UnicodeDecodeError as exc:
        _fail("service config", f"not valid UTF-8 text: {exc.reason} at byte {exc.start}")
    except RecursionError:
        _fail("service config", f"JSON nested too deeply (at most {MAX_DEPTH} levels)")
    except ValueError as exc:  # e.g. an integer literal with more digits than Python allows
        if isinstance(exc, InvalidServiceConfig):
            raise
        _fail("service config", f"not valid JSON: {exc}")


def _normalize(value: Any, path: str, depth: int) -> Any:
    """A plain-dict/list deep copy of a JSON-like value; rejects what JSON cannot hold."""
    if depth > MAX_DEPTH:
        _fail(path, f"nested too deeply (at most {MAX_DEPTH} levels)")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(path, f"{value} is not a valid JSON number")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"object keys must be strings, got {_describe(key)}")
            out[key] = _normalize(item, f"{path}.{key}" if depth else key, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalize(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    _fail(path, f"{type(value).__name__} is not a JSON value")


def _freeze(value: Any) -> Any:
    """A read-only view of a normalized JSON value (objects -> mapping proxies, lists -> tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value
