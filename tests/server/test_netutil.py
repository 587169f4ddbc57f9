"""Advertised-address detection, with injected interfaces and environment."""

from __future__ import annotations

import logging

import pytest

from waypost.netutil import (
    AddressError,
    Interface,
    advertised_address,
    bind_address,
    is_wildcard,
    list_interfaces,
    outbound_address,
    parse_host_port,
    pick_interface_address,
    registry_in_process,
    registry_is_local,
    split_host_port,
)

ETH = [
    Interface("lo", "127.0.0.1", up=True, loopback=True),
    Interface("lo", "::1", up=True, loopback=True),
    Interface("docker0", "172.17.0.1", up=False),
    Interface("eth0", "fe80::fc:ff:fe00:1", up=True),
    Interface("eth0", "fd00::2", up=True),
    Interface("eth0", "10.1.2.3", up=True),
]
REMOTE = "etcd://10.0.0.9:2379"


def detect(listen_on="0.0.0.0:0", port=8080, *, env=None, itfs=ETH, out=None, **kw):
    return advertised_address(
        listen_on, port, env=env or {}, interfaces=lambda: itfs, outbound=lambda: out, **kw
    )


def test_explicit_advertise_wins_over_everything():
    assert detect(env={"POD_IP": "10.9.9.9"}, advertise="svc.example:9000", registry=REMOTE) == "svc.example:9000"
    assert detect(advertise="10.0.0.5", registry=REMOTE) == "10.0.0.5:8080"  # bound port filled in
    assert detect(advertise="[fd00::7]", registry=REMOTE) == "[fd00::7]:8080"


@pytest.mark.parametrize("bad", ["0.0.0.0:80", "[::]:80", ":80"])
def test_explicit_wildcard_is_refused(bad):
    with pytest.raises(AddressError, match="wildcard"):
        detect(advertise=bad, registry=REMOTE)


def test_concrete_listen_host_is_advertised_as_is():
    assert detect("10.4.4.4:0", 5555, registry=REMOTE, env={"POD_IP": "10.9.9.9"}) == "10.4.4.4:5555"
    assert detect("[fd00::9]:0", 5555, registry=REMOTE) == "[fd00::9]:5555"


def test_pod_ip_set():
    assert detect(env={"POD_IP": "10.9.9.9"}, registry=REMOTE) == "10.9.9.9:8080"
    assert detect(env={"POD_IP": "fd00::42"}, registry=REMOTE) == "[fd00::42]:8080"
    # POD_IP beats the loopback shortcut for a loopback registry too: it is an explicit deployment choice
    assert detect(env={"POD_IP": "10.9.9.9"}, registry="etcd://127.0.0.1:2379") == "10.9.9.9:8080"


def test_pod_ip_unset_uses_first_up_non_loopback_ipv4():
    assert detect(env={}, registry=REMOTE) == "10.1.2.3:8080"
    assert detect(env={"POD_IP": "  "}, registry=REMOTE) == "10.1.2.3:8080"


@pytest.mark.parametrize("bad", ["not-an-ip", "0.0.0.0", "::"])
def test_bad_pod_ip_is_a_clear_error(bad):
    with pytest.raises(AddressError, match="POD_IP"):
        detect(env={"POD_IP": bad}, registry=REMOTE)


def test_ipv6_only_host_in_brackets_and_link_local_skipped():
    itfs = [Interface("lo", "127.0.0.1", loopback=True), Interface("eth0", "fe80::1"),
            Interface("eth0", "fd00::2")]
    assert detect(itfs=itfs, registry=REMOTE) == "[fd00::2]:8080"


LO_ONLY = [Interface("lo", "127.0.0.1", loopback=True), Interface("lo", "::1", loopback=True)]


def _loopback_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "waypost.netutil" and r.levelno == logging.WARNING and "loopback" in r.getMessage()]


def test_outbound_fallback_then_loopback_with_a_warning_or_error(caplog):
    caplog.set_level(logging.WARNING, logger="waypost.netutil")
    assert detect(itfs=LO_ONLY, out="10.7.7.7", registry=REMOTE) == "10.7.7.7:8080"
    assert _loopback_warnings(caplog) == []
    # no interface but loopback: loopback, said loudly
    assert detect(itfs=LO_ONLY, out=None, registry=REMOTE) == "127.0.0.1:8080"
    assert detect(itfs=LO_ONLY, out=None, registry=REMOTE, allow_loopback=True) == "127.0.0.1:8080"
    warned = _loopback_warnings(caplog)
    assert len(warned) == 2 and all("no network interface other than loopback" in m for m in warned)
    # ... unless loopback is forbidden: then an error saying what to pass
    with pytest.raises(AddressError, match="allow_loopback=False.*advertise="):
        detect(itfs=LO_ONLY, out=None, registry=REMOTE, allow_loopback=False)


@pytest.mark.parametrize("reg", ["etcd://127.0.0.1:2379", "etcd://localhost:2379,127.0.0.2:2380",
                                 "etcd://user:pw@[::1]:2379"])
def test_loopback_registry_still_advertises_the_interface_address(reg, caplog):
    """A node-local etcd proxy or a port-forward is on loopback while the clients are elsewhere."""
    caplog.set_level(logging.WARNING, logger="waypost.netutil")
    assert detect(registry=reg) == "10.1.2.3:8080"
    assert detect(registry=reg, allow_loopback=False) == "10.1.2.3:8080"
    assert detect(registry=reg, itfs=LO_ONLY, out="10.7.7.7") == "10.7.7.7:8080"
    assert _loopback_warnings(caplog) == []
    # asked explicitly: loopback, with a warning
    assert detect(registry=reg, allow_loopback=True) == "127.0.0.1:8080"
    assert detect(registry=reg, advertise="127.0.0.1") == "127.0.0.1:8080"
    warned = _loopback_warnings(caplog)
    assert len(warned) == 2 and "allow_loopback=True" in warned[0] and "advertise=" in warned[1]
    assert all("only clients on this host" in m for m in warned)


def test_in_process_registry_advertises_loopback_quietly(caplog):
    caplog.set_level(logging.WARNING, logger="waypost.netutil")
    assert detect(registry="memory://x") == "127.0.0.1:8080"
    assert detect(registry="memory://x", advertise="127.0.0.1:9") == "127.0.0.1:9"
    assert _loopback_warnings(caplog) == []
    assert detect(registry="memory://x", allow_loopback=False) == "10.1.2.3:8080"


def test_loopback_listen_host_warns_only_with_a_registry_elsewhere(caplog):
    caplog.set_level(logging.WARNING, logger="waypost.netutil")
    assert detect("127.0.0.1:0", registry="etcd://127.0.0.1:2379") == "127.0.0.1:8080"
    assert _loopback_warnings(caplog) == []
    assert detect("127.0.0.1:0", registry=REMOTE) == "127.0.0.1:8080"
    assert len(_loopback_warnings(caplog)) == 1


def test_allow_loopback_with_a_remote_registry_still_prefers_the_interface():
    assert detect(registry=REMOTE, allow_loopback=True) == "10.1.2.3:8080"
    # one remote endpoint among loopback ones means remote clients
    assert detect(registry="etcd://127.0.0.1:2379,10.0.0.9:2379", allow_loopback=True) == "10.1.2.3:8080"


def test_registry_object_url_is_used():
    class Reg:
        url = "etcd://127.0.0.1:2379"

    assert registry_is_local(Reg())
    assert not registry_is_local(object())
    assert not registry_in_process(Reg())
    Reg.url = "memory://m"
    assert registry_in_process(Reg()) and registry_in_process("memory://n") and not registry_in_process(None)


def test_never_wildcard_never_loopback_for_remote_registry():
    bad = [Interface("x", "0.0.0.0"), Interface("y", "::"), Interface("lo", "127.0.0.1", loopback=False),
           Interface("z", "10.3.3.3", up=False)]
    assert pick_interface_address(bad) is None


def test_helpers():
    assert is_wildcard("[::]") and is_wildcard("") and is_wildcard("0.0.0.0") and not is_wildcard("10.0.0.1")
    with pytest.raises(AddressError, match="listen_on 'host:abc': bad port 'abc'"):
        detect("host:abc", registry=REMOTE)


# (text, keyword arguments, (host, port))
PARSED = [
    ("10.0.0.5:8080", {}, ("10.0.0.5", 8080)),
    ("[::1]:80", {}, ("::1", 80)),
    ("[fd00::2]", {"default_port": 443}, ("fd00::2", 443)),
    ("h", {"default_port": 2379}, ("h", 2379)),
    ("  greet.example.com:1 ", {}, ("greet.example.com", 1)),
    ("under_score.local.:65535", {}, ("under_score.local.", 65535)),
    ("h:0", {"listen": True}, ("h", 0)),
    (":50051", {"listen": True}, ("", 50051)),
    ("[::]:0", {"listen": True}, ("::", 0)),
    ("18011", {"listen": True}, ("", 18011)),  # a bare PORT: every interface (all digits is no host)
    ("h:08080", {}, ("h", 8080)),
]


@pytest.mark.parametrize(("text", "kw", "expected"), PARSED, ids=[p[0] for p in PARSED])
def test_parse_host_port(text, kw, expected):
    assert parse_host_port(text, **kw) == expected


@pytest.mark.parametrize(("text", "bound"), [
    (":18000", "0.0.0.0:18000"), ("18000", "0.0.0.0:18000"), ("0", "0.0.0.0:0"), ("127.0.0.1:0", "127.0.0.1:0"),
    ("[::1]:8470", "[::1]:8470"), (" localhost:5 ", "localhost:5"),
])
def test_bind_address_is_what_grpc_binds(text, bound):
    assert bind_address(text, what="--listen") == bound


@pytest.mark.parametrize(("text", "problem"), [("a b:80", "'a b' is not a valid host name"),
                                               ("123456", "bad port '123456'"), ("h", "no port"), (":", "bad port ''")])
def test_bind_address_refuses_with_the_listening_forms(text, problem):
    with pytest.raises(AddressError) as err:
        bind_address(text, what="--listen")
    assert str(err.value).startswith(f"--listen {text!r}: {problem}; expected HOST:PORT, :PORT or PORT (every "
                                     "interface) with PORT in 0..65535"), str(err.value)


def test_a_bare_number_is_a_port_only_where_a_server_listens():
    with pytest.raises(AddressError, match="'18011' is not a valid IPv4 address"):
        split_host_port("18011")


def test_split_host_port_leaves_a_missing_port_to_the_caller():
    assert split_host_port("[fd00::1]") == ("fd00::1", None)
    assert split_host_port("h") == ("h", None)
    assert split_host_port("h:1") == ("h", 1)


# (text, keyword arguments, the problem the message names)
REFUSED = [
    ("h", {}, "no port"),
    ("h:0", {}, "bad port '0'"),
    ("h:65536", {}, "bad port '65536'"),
    ("h:", {"default_port": 1}, "bad port ''"),
    ("h:8o", {}, "bad port '8o'"),
    ("h:123456", {"listen": True}, "bad port '123456'"),
    ("h:-1", {"listen": True}, "bad port '-1'"),
    (":80", {}, "empty host"),
    ("::1", {"default_port": 1}, "IPv6 addresses must be written in brackets"),
    ("fd00::1:80", {}, "IPv6 addresses must be written in brackets"),
    ("[::1:80", {}, "'[' without ']'"),
    ("[]:80", {}, "'' in brackets is not an IPv6 address"),
    ("[10.0.0.1]:80", {}, "'10.0.0.1' in brackets is not an IPv6 address"),
    ("[::1]80", {}, "'80' after ']' is not ':PORT'"),
    ("999.1.1.1:80", {}, "'999.1.1.1' is not a valid IPv4 address"),
    ("a b:80", {}, "'a b' is not a valid host name"),
    ("h/x:80", {}, "'h/x' is not a valid host name"),
    ("a..b:80", {}, "'a..b' is not a valid host name"),
    ("x" * 64 + ":80", {}, f"{'x' * 64!r} is not a valid host name"),  # a label is at most 63 characters
]


@pytest.mark.parametrize(("text", "kw", "problem"), REFUSED, ids=[r[0][:20] for r in REFUSED])
def test_refused_addresses_name_the_input_the_problem_and_the_expected_form(text, kw, problem):
    with pytest.raises(AddressError) as err:
        parse_host_port(text, what="etcd host", **kw)
    msg = str(err.value)
    assert msg.startswith(f"etcd host {text!r}: {problem}; expected HOST"), msg
    ports = "0..65535" if kw.get("listen") else "1..65535"
    assert f"with PORT in {ports} and IPv6 addresses in brackets (e.g. 10.0.0.5:8080, [fd00::2]:8080)" in msg


def test_the_expected_form_says_whether_the_port_may_be_left_out():
    with pytest.raises(AddressError, match=r"expected HOST:PORT "):
        parse_host_port("h:0")
    with pytest.raises(AddressError, match=r"expected HOST\[:PORT\] "):
        parse_host_port("h:0", default_port=1)
    with pytest.raises(AddressError, match=r"expected HOST\[:PORT\] "):
        split_host_port("h:0")


def test_every_host_port_field_gives_the_same_error_text():
    from waypost import InvalidTarget
    from waypost.discovery.registry_url import parse_registry_url
    from waypost.resolver.target import parse_target

    tail = "with PORT in 1..65535 and IPv6 addresses in brackets (e.g. 10.0.0.5:8080, [fd00::2]:8080)"
    for call in (lambda: parse_target("etcd:///h:99999?key=k"), lambda: parse_target("direct:///h:99999"),
                 lambda: parse_target("dns:///h:99999"), lambda: parse_target("ipv4:h:99999"),
                 lambda: parse_registry_url("etcd://h:99999")):
        with pytest.raises(InvalidTarget) as e:
            call()
        assert "'h:99999': bad port '99999'; expected HOST" in str(e.value)
        assert tail in str(e.value)
    with pytest.raises(AddressError) as adv:
        detect(advertise="h:99999", registry=REMOTE)
    assert str(adv.value) == f"advertise 'h:99999': bad port '99999'; expected HOST[:PORT] {tail}".replace(
        "1..65535", "0..65535")


def test_real_host_detection_returns_usable_addresses():
    # On this machine: whatever it finds is up and typed; the outbound probe is non-loopback or None.
    for itf in list_interfaces():
        assert itf.name and itf.address
    out = outbound_address()
    assert out is None or not out.startswith("127.")
