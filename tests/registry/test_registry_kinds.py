"""The registry-kind table (``waypost.kind_table``) agrees with the parsers that read it; the shared URL option
checks (``waypost.urlparams``); go-zero's side records joined to addresses (``formats.SideRecords``)."""

from __future__ import annotations

import functools
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waypost import urlparams
from waypost.discovery.formats import (
    DEFAULT_FORMAT,
    ETCD_NAMING,
    FORMAT_NAMES,
    FORMATS,
    GOZERO,
    Entry,
    SideRecords,
)
from waypost.discovery.registry_url import parse_any, parse_registry_url
from waypost.errors import InvalidTarget
from waypost.kind_table import all_kinds, instance_registries, keyed, kind_of, part
from waypost.registries.consul import ConsulConfig
from waypost.registries.etcd.config import EtcdURL
from waypost.registries.zookeeper.config import ZkConfig
from waypost.resolver.target import known_schemes, parse_target


def _fail(problem: str) -> InvalidTarget:
    return InvalidTarget(f"bad: {problem}")


# ---- the table ---------------------------------------------------------------------------------------------


def test_every_kind_has_a_resolver_and_a_target_example_of_its_own_scheme():
    for scheme, kind in all_kinds().items():
        assert callable(part(kind, "resolver")), scheme
        assert parse_target(kind.target_example).scheme == scheme
        for alias in kind.aliases:
            assert parse_target(kind.target_example.replace(f"{scheme}:", f"{alias}:", 1)).scheme == scheme


def test_the_schemes_messages_list_keep_their_order():
    assert known_schemes() == ("direct", "etcd", "discov", "memory", "dns", "k8s", "consul", "zk", "eureka", "ipv4", "ipv6")
    assert keyed() == ("etcd", "memory")
    assert instance_registries() == ("consul", "zk", "eureka")


@pytest.mark.parametrize("scheme", ["etcd", "consul", "zk", "eureka"])
def test_a_host_without_a_port_gets_the_kinds_default_port_in_urls_and_targets(scheme):
    port = all_kinds()[scheme].default_port
    url = f"{scheme}://10.0.0.7"
    target = f"{scheme}://10.0.0.7/greet"
    parsed = parse_any(url)
    hosts = {"etcd": lambda: parsed.endpoints, "consul": lambda: (parsed.address,), "zk": lambda: parsed.hosts,
             "eureka": lambda: parsed.servers}
    assert hosts[scheme]() == (f"10.0.0.7:{port}",)
    assert parse_target(target).endpoints == (f"10.0.0.7:{port}",)


def test_dns_names_take_the_kinds_default_port():
    assert parse_target("dns:///greet.example.com").endpoints == (f"greet.example.com:{all_kinds()['dns'].default_port}",)


def test_parse_any_hands_each_kind_to_its_parser():
    assert isinstance(parse_any("etcd://127.0.0.1:2379"), EtcdURL)
    assert parse_any("memory://r1").name == "r1"  # type: ignore[attr-defined]
    assert isinstance(parse_any("consul://127.0.0.1"), ConsulConfig)
    assert isinstance(parse_any("zk://127.0.0.1"), ZkConfig)
    with pytest.raises(InvalidTarget, match="unknown scheme 'nacos'"):
        parse_any("nacos://127.0.0.1:8848")
    with pytest.raises(InvalidTarget, match="unknown scheme 'k8s'"):  # read only: no registry URL
        parse_any("k8s://default")


def test_connect_refuses_instance_registries_naming_their_publisher():
    for scheme in instance_registries():
        # its targets as its own table entry writes them (a kind's grammar may not be HOST/SERVICE)
        with pytest.raises(InvalidTarget, match=re.escape(f", and dial its targets "
                                                          f"({all_kinds()[scheme].target_example})")):
            parse_registry_url(f"{scheme}://127.0.0.1")


def test_kind_of_reads_the_scheme_and_its_aliases():
    assert kind_of("DISCOV:///h:2379?key=k") is all_kinds()["etcd"]
    assert kind_of(" zk://h") is all_kinds()["zk"]
    assert kind_of("h:2379") is None and kind_of("nacos://h") is None
    assert all_kinds()["zk"].install_hint == "pip install 'waypost[zk]'" and all_kinds()["etcd"].install_hint == ""


def test_one_list_of_wire_formats():
    assert FORMAT_NAMES == tuple(FORMATS) == ("gozero", "etcd-naming", "kratos")
    assert DEFAULT_FORMAT == FORMAT_NAMES[0]
    with pytest.raises(InvalidTarget, match="expected one of: gozero, etcd-naming, kratos"):
        parse_target("etcd:///h:2379?key=k&format=go-zero")


# ---- urlparams ---------------------------------------------------------------------------------------------


def test_options_refuse_unknown_names_and_a_name_given_twice_under_an_alias():
    pairs = urlparams.options("tls=1&cacert=/x", _fail, known=("tls", "ca"), aliases={"cacert": "ca"})
    assert list(pairs) == [("tls", "1"), ("ca", "/x")]
    with pytest.raises(InvalidTarget, match=r"unknown option 'cafile' \(known: ca, cacert, tls\)"):
        list(urlparams.options("cafile=/x", _fail, known=("tls", "ca"), aliases={"cacert": "ca"}))
    with pytest.raises(InvalidTarget, match="option 'cacert' given twice \\('ca' and 'cacert' are the same option\\)"):
        list(urlparams.options("ca=/x&cacert=/x", _fail, known=("ca",), aliases={"cacert": "ca"}))
    assert list(urlparams.options("anything=1", _fail)) == [("anything", "1")]  # names left to the caller


def test_the_first_problem_of_a_url_is_the_one_reported():
    with pytest.raises(InvalidTarget, match="tls='maybe' is not a boolean"):
        parse_registry_url("etcd://127.0.0.1:2379?tls=maybe&nope=1")
    with pytest.raises(InvalidTarget, match="unknown option 'nope'"):
        parse_registry_url("etcd://127.0.0.1:2379?nope=1&tls=maybe")


def test_flags_seconds_and_files(tmp_path):
    assert urlparams.flag("tls", " ON ", _fail) is True and urlparams.flag("tls", "", _fail) is False
    with pytest.raises(InvalidTarget, match=r"tls='2' is not a boolean \(use 1 or 0\)"):
        urlparams.flag("tls", "2", _fail)
    assert urlparams.seconds("t", "3600", _fail) == 3600.0
    for bad, why in (("x", "is not a number of seconds"), ("0", "between 0 and 3600"), ("nan", "between 0 and 3600"),
                     ("inf", "between 0 and 3600")):
        with pytest.raises(InvalidTarget, match=why):
            urlparams.seconds("t", bad, _fail)
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert urlparams.tls_file("CA", str(ca), _fail) == os.path.abspath(ca)
    with pytest.raises(InvalidTarget, match="TLS CA file '' does not exist"):
        urlparams.tls_file("CA", "", _fail)


@settings(max_examples=int(os.environ.get("WAYPOST_FUZZ_EXAMPLES", "200")), deadline=None)
@given(query=st.text(alphabet="a=&%;+ts01x\u00e9", max_size=40))
def test_options_raise_only_what_fail_makes(query):
    fail = functools.partial(urlparams.url_error, "etcd://h", example="etcd://h")
    try:
        for name, value in urlparams.options(query, fail, known=("tls", "t"), aliases={"s": "t"}):
            if name == "tls":
                urlparams.flag(name, value, fail)
            else:
                urlparams.seconds(name, value, fail)
    except InvalidTarget:
        pass


# ---- go-zero side records ----------------------------------------------------------------------------------


def test_side_records_join_the_address_they_name():
    sides = SideRecords(GOZERO, "svc/", GOZERO.side_prefix("svc") or "")
    [(side_key, value)] = GOZERO.encode_side("svc", "10.0.0.1:80", 7, {"zone": "a"})
    assert sides.side_key("svc/7") == side_key and sides.main_key(side_key) == "svc/7"
    assert not sides and not sides.knows("svc/7")
    assert sides.put(side_key, value) == "svc/7"
    assert sides.knows("svc/7") and len(sides) == 1
    assert sides.join("svc/7", Entry("10.0.0.1:80")).metadata == {"zone": "a"}
    assert sides.join("svc/7", Entry("10.0.0.2:80")) == Entry("10.0.0.2:80")  # the id now names another address
    assert sides.put(side_key, b"not json") == "svc/7"  # unusable: counts as none
    assert not sides.knows("svc/7")
    sides.put(side_key, value)
    assert sides.delete(side_key) == "svc/7" and not sides


def test_formats_without_side_records_join_nothing():
    sides = SideRecords(ETCD_NAMING, "svc/", "")
    entry = Entry("10.0.0.1:80")
    assert sides.join("svc/10.0.0.1:80", entry) is entry
