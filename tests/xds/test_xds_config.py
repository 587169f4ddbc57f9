"""Export specs (``NAME=TARGET [OPT=V ...]``) and config files (JSON, TOML): what parses, and that any bad input is an
``XdsConfigError`` naming what is wrong (hypothesis), never another exception."""

from __future__ import annotations

import json
import string

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waypost.xds import XdsConfigError, load_config, parse_config, parse_export
from waypost.xds.exports import config_from_dict
from waypost.xds.sources import services_under


def test_export_spec_with_options() -> None:
    e = parse_export("greeter=etcd:///127.0.0.1:2379?key=greet.rpc&format=kratos policy=ring_hash hash_header=x-u "
                     "prefer=zone:eu-1a retries=2 retry_on=unavailable,internal serve_empty=false")
    assert e.name == "greeter" and e.target == "etcd:///127.0.0.1:2379?key=greet.rpc&format=kratos"
    assert (e.policy, e.hash_header, e.prefer, e.retries) == ("ring_hash", "x-u", ("zone", "eu-1a"), 2)
    assert e.retry_on == ("unavailable", "internal") and e.serve_empty is False


def test_bare_key_uses_the_given_rule() -> None:
    e = parse_export("g=greet.rpc", bare_key=lambda k: f"etcd:///10.0.0.1:2379?key={k}")
    assert e.target == "etcd:///10.0.0.1:2379?key=greet.rpc"
    with pytest.raises(XdsConfigError, match="no scheme"):
        parse_export("g=greet.rpc")


@pytest.mark.parametrize(("spec", "says"), [
    ("", "empty"),
    ("greeter", "NAME=TARGET"),
    ("greeter=", "NAME=TARGET"),
    ("bad!name=direct:///127.0.0.1:1", "NAME must be"),
    ("g=nope://x", "scheme"),
    ("g=direct:///127.0.0.1:1 policy", "OPTION=VALUE"),
    ("g=direct:///127.0.0.1:1 colour=red", "unknown option 'colour'"),
    ("g=direct:///127.0.0.1:1 policy=a policy=b", "given twice"),
    ("g=direct:///127.0.0.1:1 prefer=zone", "zone:ZONE"),
    ("g=direct:///127.0.0.1:1 timeout=2s", "unknown option 'timeout'"),
    ("g=direct:///127.0.0.1:1 retries=99", "0 to 10"),
    ("g=direct:///127.0.0.1:1 retry_on=teapot", "teapot"),
    ("g=direct:///127.0.0.1:1 serve_empty=maybe", "true or false"),
    ("g=direct:///127.0.0.1:1 policy_config=x", "config file"),
    ("g=direct:///127.0.0.1:1 policy=ring_hash hash_header=x-bin", "header"),
])
def test_bad_export_specs_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(XdsConfigError, match=says):
        parse_export(spec)


def test_toml_and_json_config(tmp_path) -> None:
    toml = tmp_path / "xds.toml"
    toml.write_text('''
[exports.greeter]
target = "etcd:///127.0.0.1:2379?key=greet.rpc"
policy = "client_side_weighted_round_robin"
policy_config = { enableOobLoadReport = true, blackoutPeriod = "0s" }

[exports.plain]
target = ["direct:///127.0.0.1:1", "dns:///localhost:2"]

[[prefixes]]
registry = "etcd://127.0.0.1:2379"
prefix = "prod/"
policy = "round_robin"
''')
    cfg = load_config(toml)
    assert [e.name for e in cfg.exports] == ["greeter", "plain"]
    assert cfg.exports[1].target == ("direct:///127.0.0.1:1", "dns:///localhost:2")
    assert cfg.prefixes[0].prefix == "prod/" and cfg.prefixes[0].options == {"policy": "round_robin"}
    js = tmp_path / "xds.json"
    js.write_text(json.dumps({"exports": {"a": "direct:///127.0.0.1:1"}}))
    assert load_config(js).exports[0].name == "a"
    with pytest.raises(XdsConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(XdsConfigError, match="not valid TOML"):
        parse_config("[exports", "f.toml")
    with pytest.raises(XdsConfigError, match=r"prefixes\[0\]: registry must be"):
        config_from_dict({"prefixes": [{"registry": "consul://x", "prefix": "p/"}]})
    with pytest.raises(XdsConfigError, match="policy_config: unknown key 'ringSize'"):
        config_from_dict({"exports": {"a": {"target": "direct:///127.0.0.1:1", "policy": "ring_hash",
                                            "policy_config": {"ringSize": 3}}}})


def test_services_under_a_prefix() -> None:
    keys = ["prod/a.rpc/1", "prod/a.rpc/2", "prod/b.rpc/7", "other/c/1", "_waypost/meta/prod/a.rpc/1", "prod/x"]
    assert services_under(keys, "prod/") == {"prod/a.rpc", "prod/b.rpc"}
    flat = ["a.rpc/1", "b.rpc/2", "bad name/3"]
    assert services_under(flat, "") == {"a.rpc", "b.rpc"}


_text = st.text(alphabet=string.printable + "é\x00", max_size=120)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=True) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(["target", "policy", "policy_config", "hash_header", "prefer", "service_config", "retries",
                         "retry_on", "outlier_detection", "serve_empty", "registry", "prefix", "x"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_text, st.builds(lambda n, t, o: f"{n}={t} {o}", _text, _text, _text)))
def test_fuzz_export_specs(spec: str) -> None:
    try:
        parse_export(spec)
    except XdsConfigError as e:
        assert str(e).startswith("export"), str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    _json,
    st.fixed_dictionaries({"exports": st.dictionaries(_text, st.one_of(_text, st.dictionaries(_keys, _json)),
                                                      max_size=3)}),
    st.fixed_dictionaries({"prefixes": st.lists(st.dictionaries(_keys, _json), max_size=3)}),
))
def test_fuzz_config_objects(data) -> None:
    try:
        config_from_dict(data, "cfg")
    except XdsConfigError as e:
        assert str(e).startswith("cfg"), str(e)


@settings(max_examples=100, deadline=None)
@given(_text)
def test_fuzz_config_text(text: str) -> None:
    for as_json in (True, False):
        try:
            parse_config(text, "f", as_json=as_json)
        except XdsConfigError as e:
            assert str(e).startswith("f"), str(e)
