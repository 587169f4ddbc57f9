"""Advertised-address detection, with injected interfaces and environment."""

from __future__ import annotations

import pytest

from waypost.netutil import (
    AddressError,
    Interface,
    advertised_address,
    is_wildcard,
    list_interfaces,
    outbound_address,
    pick_interface_address,
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


def test_outbound_fallback_then_error_or_loopback():
    lo_only = [Interface("lo", "127.0.0.1", loopback=True)]
    assert detect(itfs=lo_only, out="10.7.7.7", registry=REMOTE) == "10.7.7.7:8080"
    with pytest.raises(AddressError, match="allow_loopback"):
        detect(itfs=lo_only, out=None, registry=REMOTE)
    assert detect(itfs=lo_only, out=None, registry=REMOTE, allow_loopback=True) == "127.0.0.1:8080"


def test_loopback_registry_advertises_loopback():
    for reg in ("etcd://127.0.0.1:2379", "etcd://localhost:2379,127.0.0.2:2380", "memory://x",
                "etcd://user:pw@[::1]:2379"):
        assert detect(registry=reg) == "127.0.0.1:8080", reg
    # ... unless the caller forbids it
    assert detect(registry="etcd://127.0.0.1:2379", allow_loopback=False) == "10.1.2.3:8080"
    # one remote endpoint among loopback ones means remote clients
    assert detect(registry="etcd://127.0.0.1:2379,10.0.0.9:2379") == "10.1.2.3:8080"


def test_registry_object_url_is_used():
    class Reg:
        url = "etcd://127.0.0.1:2379"

    assert registry_is_local(Reg())
    assert not registry_is_local(object())


def test_never_wildcard_never_loopback_for_remote_registry():
    bad = [Interface("x", "0.0.0.0"), Interface("y", "::"), Interface("lo", "127.0.0.1", loopback=False),
           Interface("z", "10.3.3.3", up=False)]
    assert pick_interface_address(bad) is None


def test_helpers():
    assert split_host_port("[::1]:80") == ("::1", 80)
    assert split_host_port("h:0") == ("h", 0)
    assert split_host_port("fd00::1") == ("fd00::1", None)
    assert is_wildcard("[::]") and is_wildcard("") and is_wildcard("0.0.0.0") and not is_wildcard("10.0.0.1")
    with pytest.raises(AddressError, match="port"):
        split_host_port("h:99999")
    with pytest.raises(AddressError, match="listen_on"):
        detect("host:abc", registry=REMOTE)


def test_real_host_detection_returns_usable_addresses():
    # On this machine: whatever it finds is up and typed; the outbound probe is non-loopback or None.
    for itf in list_interfaces():
        assert itf.name and itf.address
    out = outbound_address()
    assert out is None or not out.startswith("127.")
