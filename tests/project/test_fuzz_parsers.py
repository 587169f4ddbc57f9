"""Fuzzing: the config and target parsers raise only their own error (or succeed), whatever the input."""

from __future__ import annotations

import json
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waypost import InvalidServiceConfig, InvalidTarget
from waypost.discovery.registry_url import parse_registry_url
from waypost.durations import DurationError, format_duration, parse_duration
from waypost.netutil import (
    AddressError,
    join_host_port,
    normalize_host_port,
    parse_host_port,
    split_host_port,
)
from waypost.redaction import redact_url as redact
from waypost.resolver.target import Target, parse_target
from waypost.service_config import ServiceConfig, parse_service_config

# WAYPOST_FUZZ_EXAMPLES=5000 runs a longer search locally; the suite keeps it short.
FUZZ = settings(
    max_examples=int(os.environ.get("WAYPOST_FUZZ_EXAMPLES", "250")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# names that steer generated values into the parser's interesting branches
FIELD_NAMES = [
    "loadBalancingPolicy", "loadBalancingConfig", "methodConfig", "retryThrottling", "healthCheckConfig",
    "name", "service", "method", "timeout", "waitForReady", "retryPolicy", "hedgingPolicy", "maxAttempts",
    "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes", "maxTokens", "tokenRatio",
    "serviceName", "pick_first", "round_robin", "random", "weighted_round_robin", "p2c_ewma", "least_request",
    "consistent_hash", "outlier_detection", "childPolicy", "choiceCount", "hashHeader", "interval",
    "baseEjectionTime", "maxEjectionTime", "maxEjectionPercent", "successRateEjection", "failurePercentageEjection",
    "stdevFactor", "enforcementPercentage", "minimumHosts", "requestVolume", "threshold", "unknown",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1s", "0.1s", "0s", "-1s", "1.5", "100ms", "UNAVAILABLE", "unavailable", "OK", "", "round_robin",
                     "P2C_EWMA", "x-hash", ":path", "1e3s", "9999999999999s"]),
    st.text(max_size=12),
)
KEYS = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(KEYS, children, max_size=5),
    ),
    max_leaves=30,
)


def _structured() -> st.SearchStrategy:
    """Configs shaped like real ones, with arbitrary values in the slots."""
    retry = st.dictionaries(
        st.sampled_from(["maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes",
                         "perAttemptRecvTimeout", "maxAttempt"]),
        JSON_VALUES, max_size=6,
    )
    name = st.dictionaries(st.sampled_from(["service", "method", "x"]), st.one_of(st.text(max_size=6), SCALARS),
                           max_size=2)
    method = st.fixed_dictionaries(
        {"name": st.one_of(st.lists(name, max_size=3), JSON_VALUES)},
        optional={"timeout": SCALARS, "waitForReady": SCALARS, "retryPolicy": st.one_of(retry, JSON_VALUES)},
    )
    policy_entry = st.dictionaries(st.sampled_from(FIELD_NAMES[20:28] + ["xds", "grpclb"]),
                                   st.one_of(st.none(), st.dictionaries(KEYS, JSON_VALUES, max_size=4)),
                                   min_size=1, max_size=2)
    return st.fixed_dictionaries(
        {},
        optional={
            "loadBalancingConfig": st.one_of(st.lists(policy_entry, max_size=3), JSON_VALUES),
            "loadBalancingPolicy": st.one_of(st.sampled_from(FIELD_NAMES[20:28]), SCALARS),
            "methodConfig": st.one_of(st.lists(method, max_size=3), JSON_VALUES),
            "retryThrottling": st.one_of(
                st.fixed_dictionaries({"maxTokens": SCALARS, "tokenRatio": SCALARS}), JSON_VALUES),
            "healthCheckConfig": st.one_of(st.fixed_dictionaries({"serviceName": SCALARS}), JSON_VALUES),
        },
    )


def _perturbed(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly-valid objects: as generated, or with one field replaced, removed or added."""

    @st.composite
    def perturb(draw):
        obj = dict(draw(valid))
        action = draw(st.sampled_from(["keep", "keep", "replace", "remove", "add"]))
        if action == "replace" and obj:
            obj[draw(st.sampled_from(sorted(obj)))] = draw(JSON_VALUES)
        elif action == "remove" and obj:
            obj.pop(draw(st.sampled_from(sorted(obj))))
        elif action == "add":
            obj[draw(KEYS)] = draw(JSON_VALUES)
        return obj

    return perturb()


VALID_RETRY = st.fixed_dictionaries({
    "maxAttempts": st.integers(min_value=2, max_value=9),
    "initialBackoff": st.sampled_from(["0.1s", "1s", "0.000001s", "2.5s"]),
    "maxBackoff": st.sampled_from(["1s", "30s", "0.5s"]),
    "backoffMultiplier": st.one_of(st.integers(min_value=1, max_value=5), st.floats(min_value=0.1, max_value=10)),
    "retryableStatusCodes": st.lists(st.sampled_from(["UNAVAILABLE", "unavailable", 14, 4, "Internal"]),
                                     min_size=1, max_size=3),
})
VALID_NAME = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"service": st.sampled_from(["a.S", "b.T"])},
                          optional={"method": st.sampled_from(["M", "N", ""])}),
)
VALID_METHOD = st.fixed_dictionaries(
    {"name": st.lists(_perturbed(VALID_NAME), min_size=1, max_size=3)},
    optional={"timeout": st.sampled_from(["1s", "0.25s", "10s"]), "waitForReady": st.booleans(),
              "retryPolicy": _perturbed(VALID_RETRY)},
)
VALID_LB = st.lists(
    st.sampled_from(FIELD_NAMES[20:28] + ["xds", "grpclb"]).map(lambda name: {name: {}}), min_size=1, max_size=3)
NEAR_VALID_CONFIG = _perturbed(st.fixed_dictionaries({}, optional={
    "loadBalancingConfig": VALID_LB,
    "loadBalancingPolicy": st.sampled_from(["round_robin", "PICK_FIRST", "p2c_ewma"]),
    "methodConfig": st.lists(_perturbed(VALID_METHOD), max_size=3),
    "retryThrottling": _perturbed(st.fixed_dictionaries({
        "maxTokens": st.floats(min_value=0.001, max_value=1000), "tokenRatio": st.floats(min_value=0.001, max_value=5),
    })),
    "healthCheckConfig": _perturbed(st.fixed_dictionaries({"serviceName": st.text(max_size=5)})),
}))


def _check_config(raw, balancer=None) -> None:
    try:
        cfg = parse_service_config(raw, balancer=balancer)
    except InvalidServiceConfig as exc:
        assert str(exc)  # always says something
        return
    assert isinstance(cfg, ServiceConfig)
    # a valid config answers lookups for any method name
    for method in ("/a.S/M", "", "/", "x"):
        cfg.method_config(method)


@FUZZ
@given(JSON_VALUES)
def test_arbitrary_json_values(raw):
    _check_config(raw)


@FUZZ
@given(_structured(), st.one_of(st.none(), st.sampled_from(FIELD_NAMES[19:28]), st.text(max_size=6)))
def test_config_shaped_values(raw, balancer):
    _check_config(raw, balancer)
    # the same config as JSON text gives the same answer
    try:
        text = json.dumps(raw, allow_nan=False)
    except ValueError:
        return
    _check_config(text, balancer)


@FUZZ
@given(NEAR_VALID_CONFIG, st.one_of(st.none(), st.sampled_from(["round_robin", "p2c_ewma", "nope"])))
def test_near_valid_configs(raw, balancer):
    _check_config(raw, balancer)
    _check_config(json.dumps(raw), balancer)


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    _check_config(text)


@FUZZ
@given(st.binary(max_size=100))
def test_arbitrary_bytes(data):
    _check_config(data)


@FUZZ
@given(JSON_VALUES.map(lambda v: json.dumps(v)), st.integers(min_value=0, max_value=40), st.text(max_size=3))
def test_mutated_json_text(text, pos, insert):
    _check_config(text[:pos] + insert + text[pos:])


@FUZZ
@given(st.one_of(st.text(max_size=30), st.from_regex(r"-?[0-9]{1,7}(\.[0-9]{1,9})?s", fullmatch=True)))
def test_durations(text):
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        assert str(exc)
        return
    # What parses formats to a canonical text that parses back to the same value (to the nanosecond).
    canonical = format_duration(seconds)
    assert parse_duration(canonical) == pytest.approx(seconds, rel=1e-15, abs=1e-9)
    assert format_duration(parse_duration(canonical)) == canonical


# Below 2**20 s a float still holds every nanosecond, so the text itself must come back.
NANO_EXACT = 2**20 - 1


@FUZZ
@given(st.integers(min_value=-NANO_EXACT, max_value=NANO_EXACT), st.integers(min_value=0, max_value=999_999_999))
def test_duration_format_parse_round_trip(whole, nanos):
    sign = "-" if whole < 0 or (whole == 0 and nanos and nanos % 2) else ""  # also "-0.x" durations
    canonical = f"{sign}{abs(whole)}" + (f".{nanos:09d}".rstrip("0") if nanos else "") + "s"
    if canonical == "-0s":
        canonical = "0s"
    assert format_duration(parse_duration(canonical)) == canonical
    assert format_duration(parse_duration(f"{sign}{abs(whole)}.{nanos:09d}s")) == canonical  # padded input


URL_ALPHABET = string.ascii_letters + string.digits + ":/?&=%@[],.#+-_ \t"
TARGET_PARTS = st.sampled_from([
    "etcd://", "discov://", "direct://", "memory://", "dns://", "ipv4:", "ipv6:", "/", "//", "///", "?", "&", "=",
    "key=", "format=", "exact=", "user=", "password=", "tls=", "cacert=", "certfile=", "keyfile=", "kratos",
    "gozero", "etcd-naming", "127.0.0.1", ":2379", "[::1]", ":0", ":65536", ",", "@", "u:p@", "%", "%2F", "%zz",
    "%ff", "h", "greet.rpc", "#", "1", "true", "[", "]", ":",
    "k8s://", "consul://", "zk://", "ns", "svc", "grpc", ":50051", "kubeconfig=", "context=", "tag=", "dc=",
    "token=", "namespace=", "session_timeout=", "a,b", "Prod", "-",
])


def _check_target(text) -> None:
    try:
        target = parse_target(text)
    except InvalidTarget as exc:
        assert str(exc)
        return
    assert isinstance(target, Target)
    assert target.scheme in ("direct", "etcd", "memory", "dns", "k8s", "consul", "zk")
    repr(target)
    str(target)
    if target.uses_registry:
        assert target.key
        target.registry_url()
    elif target.scheme == "k8s":
        assert target.key and target.options["port"]
    else:
        assert target.endpoints
        if target.scheme in ("consul", "zk"):
            assert target.key and "/" not in target.key
            from waypost.registries.consul import from_target as consul_config
            from waypost.registries.zookeeper.config import from_target as zk_config

            try:  # the registry's own settings from the target: valid, or a clear InvalidTarget
                (consul_config if target.scheme == "consul" else zk_config)(target)
            except InvalidTarget as exc:
                assert str(exc)


@FUZZ
@given(st.text(max_size=80))
def test_arbitrary_target_strings(text):
    _check_target(text)


@FUZZ
@given(st.text(alphabet=URL_ALPHABET, max_size=60))
def test_url_alphabet_targets(text):
    _check_target(text)


@FUZZ
@given(st.lists(TARGET_PARTS, max_size=12).map("".join))
def test_assembled_targets(text):
    _check_target(text)


HOSTS = st.sampled_from(["127.0.0.1:2379", "h1:2379", "[::1]:1", "localhost:80", "a.b.c:65535", "h", "h:0", ""])
NEAR_VALID_TARGET = st.builds(
    lambda scheme, auth, hosts, query: f"{scheme}{auth}/{','.join(hosts)}{'?' + '&'.join(query) if query else ''}",
    st.sampled_from(["etcd://", "discov://", "direct://", "memory://", "dns://", "ETCD://", "foo://", "k8s://",
                     "consul://", "zk://"]),
    st.sampled_from(["", "", "u:p@", "127.0.0.1:2379", "reg1", "8.8.8.8"]),
    st.lists(HOSTS, max_size=3),
    st.lists(st.sampled_from(["key=greet.rpc", "key=%2Fa%2Fb", "key=", "format=kratos", "format=etcd-naming",
                              "exact=1", "exact=maybe", "tls=1", "user=root", "password=pw", "cacert=%2Fca.pem",
                              "certfile=c", "keyfile=k", "bogus=1"]), max_size=4),
)


@FUZZ
@given(NEAR_VALID_TARGET, st.integers(min_value=0, max_value=60), st.text(max_size=2), st.integers(0, 2))
def test_near_valid_targets(text, pos, insert, drop):
    _check_target(text)
    _check_target(text[:pos] + insert + text[pos + drop:])


@FUZZ
@given(st.text(alphabet=string.ascii_letters + string.digits + "!$'()+,;=-._~", min_size=1, max_size=12))
def test_passwords_never_leak(password):
    from urllib.parse import quote

    for text in (f"etcd://root:{quote(password, safe='')}@h:2379/k",
                 f"etcd://root:{quote(password, safe='')}@h:99999/k",
                 f"etcd:///h:2379?key=k&user=root&password={quote(password, safe='')}&bogus=1"):
        try:
            target = parse_target(text)
        except InvalidTarget as exc:
            assert f":{password}@" not in str(exc) and f"password={password}" not in str(exc)
            continue
        assert target.options["password"] == password
        shown = repr(target) + str(target)
        assert f":{quote(password, safe='')}@" not in shown
        assert f"'password': {password!r}" not in shown
        assert "'password': '***'" in repr(target)
    assert "***" in redact(f"etcd://root:{password}@h:1/k")


# ---- host:port (netutil's one parser, used by targets, registry URLs, DNS and advertised addresses) ----

LABELS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,62}", fullmatch=True)
HOST_NAMES = st.lists(LABELS, min_size=1, max_size=4).map(".".join).filter(lambda h: len(h) <= 253)
HOSTS_ANY = st.one_of(HOST_NAMES, st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
PORTS = st.integers(min_value=1, max_value=65535)
HOSTPORT_ALPHABET = string.ascii_letters[:6] + string.digits + ":[]._-% /"


@FUZZ
@given(HOSTS_ANY, PORTS)
def test_host_port_format_then_parse_round_trips(host, port):
    text = join_host_port(host, port)
    assert parse_host_port(text) == (host, port)
    assert split_host_port(text) == (host, port)
    assert normalize_host_port(text) == text
    # every caller takes the formatted address as it is
    assert parse_target(f"direct:///{text}").endpoints == (text,)
    assert parse_target(f"etcd:///{text}?key=k").endpoints == (text,)
    assert parse_registry_url(f"etcd://{text}").endpoints == (text,)


@FUZZ
@given(HOSTS_ANY, st.integers(min_value=1, max_value=65535))
def test_host_without_port_takes_the_default(host, default):
    text = f"[{host}]" if ":" in host else host
    assert parse_host_port(text, default_port=default) == (host, default)
    assert split_host_port(text) == (host, None)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.text(alphabet=HOSTPORT_ALPHABET, max_size=40)),
       st.sampled_from([None, 2379]), st.booleans())
def test_host_port_raises_only_address_error(text, default, listen):
    try:
        host, port = parse_host_port(text, default_port=default, listen=listen)
    except AddressError as exc:
        assert repr(text) in str(exc) and "expected HOST" in str(exc)
        return
    assert (0 if listen else 1) <= port <= 65535
    if host:  # the canonical form parses to the same pair
        assert parse_host_port(join_host_port(host, port), listen=listen) == (host, port)


# -- the discovery cache file (waypost.discovery.cache) --------------------------------------------------

_CACHE_KEY = "fz.rpc"
_CACHE_PREFIXES = ["fz.rpc/", "_waypost/meta/fz.rpc/"]
_CACHE_RECORDS = st.dictionaries(
    st.one_of(st.text(max_size=6).map(lambda s: "fz.rpc/" + s), st.text(max_size=10)),
    st.tuples(st.binary(max_size=12), st.integers(min_value=-2, max_value=40)), max_size=4)


@st.composite
def _cache_documents(draw) -> bytes:
    """Cache files: valid ones (encode's output), the same with one field replaced or removed, and JSON."""
    from waypost.discovery import cache

    records = draw(_CACHE_RECORDS)
    data = cache.encode(_CACHE_KEY, draw(st.booleans()), draw(st.sampled_from(["gozero", "kratos"])),
                        "etcd://h:2379", [("fz.rpc/", draw(st.integers(min_value=-1, max_value=50)), records)],
                        written=draw(st.floats(allow_nan=True, allow_infinity=True)))
    how = draw(st.sampled_from(["keep", "field", "record", "bytes", "json"]))
    doc = json.loads(data)
    if how == "field":
        doc[draw(st.sampled_from(["waypost", "version", "key", "exact", "format", "written", "sources", "x"]))] = \
            draw(JSON_VALUES)
    elif how == "record":
        recs = doc["sources"]["fz.rpc/"]["records"]
        recs.append(draw(st.one_of(JSON_VALUES, st.lists(st.one_of(SCALARS, st.sampled_from(["fz.rpc/x", "AA==",
                                                                                           "!!"])), max_size=4))))
    elif how == "bytes":
        raw = bytearray(data)
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            if raw:
                raw[draw(st.integers(min_value=0, max_value=len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    elif how == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    return json.dumps(doc, allow_nan=True).encode()


@FUZZ
@given(st.one_of(_cache_documents(), st.binary(max_size=64)))
def test_cache_file_parser_raises_only_cache_error(data):
    from waypost.discovery import cache

    try:
        got = cache.parse(data, _CACHE_KEY, False, "gozero", _CACHE_PREFIXES)
    except cache.CacheError:
        return
    assert set(got.sources) == set(_CACHE_PREFIXES)
    for prefix, cols in got.sources.items():
        assert cols.keys == sorted(cols.keys)
        assert all(k.startswith(prefix) and k != prefix for k in cols.keys)
        assert all(isinstance(v, bytes) for v in cols.values)
        assert all(0 <= rev <= cols.revision for rev in cols.mod_revisions)
