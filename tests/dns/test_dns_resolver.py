"""The DNS kind against a real DNS server (dnsmasq): its Discovery's lookups, TTLs and errors, and the
re-resolution loop of the generic resolver over it."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from pathlib import Path

import pytest

import waypost
import waypost.registries.dns.discovery as wdns
from harness.waiting import wait_until
from tests.dns.support import Dnsmasq, dnsmasq  # noqa: F401  (fixture)
from waypost.kinds.resolver import KindResolver
from waypost.registries.dns.kind import KIND
from waypost.resolver import ResolverOptions

pytest.importorskip("dns.resolver")


def resolver(target: str, options: ResolverOptions | None = None, discovery: type[wdns.DnsDiscovery] = wdns.DnsDiscovery,
             **kw: float) -> KindResolver:
    """The resolver a dial makes, over a ``discovery`` made with ``kw`` (intervals and timeout, in seconds)."""
    kind = dataclasses.replace(KIND, discovery=lambda t: discovery(t, **kw))
    return KindResolver(kind, waypost.parse_target(target), options)


def lookup(target: str, **kw: float) -> wdns.DnsDiscovery:
    return wdns.DnsDiscovery(waypost.parse_target(target), **kw)


class Collector:
    """on_update / on_error recorder (called on the control loop)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.updates: list[list[str]] = []
        self.errors: list[str] = []

    def on_update(self, backends) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.updates.append([b.address for b in backends])

    def on_error(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)

    @property
    def last(self) -> list[str] | None:
        with self.lock:
            return self.updates[-1] if self.updates else None


class TimedDiscovery(wdns.DnsDiscovery):
    """Records when each lookup starts (monotonic seconds)."""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.times: list[float] = []

    async def lookup(self) -> wdns.Resolution:
        self.times.append(time.monotonic())
        return await super().lookup()


# ---- pure scheduling ----------------------------------------------------------------------------


def test_next_delay_clamps_the_ttl_between_min_interval_and_interval():
    assert wdns.next_delay(None, 30, 5) == 30  # system resolver: no TTL
    assert wdns.next_delay(1, 30, 5) == 5  # short TTL: not more often than min_interval
    assert wdns.next_delay(12, 30, 5) == 12  # TTL inside the bounds: followed
    assert wdns.next_delay(3600, 30, 5) == 30  # long TTL: still re-resolved every interval
    assert wdns.next_delay(0, 2, 5) == 2  # min_interval above the interval: the interval wins


def test_channel_options_are_read_in_milliseconds():
    d = resolver("dns:///svc.example:80").discovery
    assert isinstance(d, wdns.DnsDiscovery)
    assert (d.interval, d.min_interval, d.timeout) == (30.0, 5.0, 5.0)
    d = resolver("dns:///svc.example:80", ResolverOptions(channel_options=[
        (wdns.INTERVAL_OPTION, 2500), (wdns.MIN_INTERVAL_OPTION, 100), (wdns.TIMEOUT_OPTION, 750),
        ("grpc.enable_retries", 0)])).discovery
    assert isinstance(d, wdns.DnsDiscovery)
    assert (d.interval, d.min_interval, d.timeout) == (2.5, 0.1, 0.75)


@pytest.mark.parametrize("value", [0, -1, "1000", True, float("inf")])
def test_bad_interval_option_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=wdns.INTERVAL_OPTION):
        resolver("dns:///svc.example:80", ResolverOptions(channel_options=[(wdns.INTERVAL_OPTION, value)]))


def test_dial_with_a_bad_dns_option_raises():
    with pytest.raises(ValueError, match="dns_min_time_between_resolutions_ms"):
        waypost.dial("dns:///localhost:80", options=[(wdns.MIN_INTERVAL_OPTION, 0)])


def test_bad_constructor_interval_is_an_error():
    with pytest.raises(ValueError, match="interval"):
        lookup("dns:///svc.example:80", interval=0)


# ---- lookups against dnsmasq ----------------------------------------------------------------------


async def test_a_and_aaaa_records_with_their_ttl(tmp_path: Path):
    d = Dnsmasq(tmp_path, ttl=7)
    d.set({"svc.test": ["127.0.0.3", "127.0.0.2", "::1"], "v6only.test": ["::1"]})
    d.start()
    try:
        res = await lookup(d.target("svc.test", 8080)).lookup()
        assert res == wdns.Resolution(("127.0.0.2:8080", "127.0.0.3:8080", "[::1]:8080"), 7.0)
        res = await lookup(d.target("v6only.test", 9)).lookup()
        assert res.addresses == ("[::1]:9",)
        # default port 443, as gRPC
        assert (await lookup(f"dns://{d.authority}/svc.test").lookup()).addresses[0] == "127.0.0.2:443"
    finally:
        d.stop()


async def test_nxdomain_names_the_host_and_the_server(dnsmasq: Dnsmasq):  # noqa: F811
    with pytest.raises(wdns.DnsLookupError) as ei:
        await lookup(dnsmasq.target("missing.test", 80)).lookup()
    assert str(ei.value) == f"dns: missing.test does not exist (NXDOMAIN via {dnsmasq.authority})"


async def test_server_down_is_a_timeout_naming_the_host(dnsmasq: Dnsmasq):  # noqa: F811
    dnsmasq.stop()
    with pytest.raises(wdns.DnsLookupError) as ei:
        await lookup(dnsmasq.target("svc.test", 80), timeout=0.3).lookup()
    assert str(ei.value) == f"dns: lookup of svc.test via {dnsmasq.authority} timed out after 0.3 s"


async def test_system_resolver_unknown_name_names_the_host():
    with pytest.raises(wdns.DnsLookupError, match=r"^dns: cannot resolve no-such-host\.invalid: "):
        await lookup("dns:///no-such-host.invalid:80").lookup()


async def test_ip_literal_needs_no_lookup():
    assert (await lookup("dns:///[::1]:5").lookup()) == wdns.Resolution(("[::1]:5",), None)


# ---- the loop -------------------------------------------------------------------------------------


def test_records_changed_while_running_are_pushed_and_failures_keep_the_last_set(dnsmasq: Dnsmasq):  # noqa: F811
    dnsmasq.set({"svc.test": ["127.0.0.2"]})
    r = resolver(dnsmasq.target("svc.test", 80), interval=0.2, min_interval=0.1, timeout=0.3)
    c = Collector()
    r.start(c.on_update, c.on_error)
    try:
        wait_until(lambda: c.last == ["127.0.0.2:80"], what="first list")
        dnsmasq.set({"svc.test": ["127.0.0.2", "127.0.0.3"]})
        wait_until(lambda: c.last == ["127.0.0.2:80", "127.0.0.3:80"], what="added address")
        dnsmasq.set({"svc.test": ["127.0.0.3"]})
        wait_until(lambda: c.last == ["127.0.0.3:80"], what="removed address")
        n = len(c.updates)
        dnsmasq.stop()  # server down: errors reported, the last list is never replaced
        wait_until(lambda: len(c.errors) >= 2, what="lookup failures")
        assert len(c.updates) == n
        assert all("timed out" in e and "svc.test" in e for e in c.errors)
        dnsmasq.set({"svc.test": ["127.0.0.4"]})
        dnsmasq.start()  # same port: the resolver recovers on its next retry
        wait_until(lambda: c.last == ["127.0.0.4:80"], what="recovery")
        assert c.updates[n - 1:] == [["127.0.0.3:80"], ["127.0.0.4:80"]]
    finally:
        r.close()


def test_name_removed_after_a_good_set_keeps_the_set_until_it_returns(dnsmasq: Dnsmasq):  # noqa: F811
    dnsmasq.set({"svc.test": ["127.0.0.2"]})
    r = resolver(dnsmasq.target("svc.test", 80), interval=0.2, min_interval=0.1)
    c = Collector()
    r.start(c.on_update, c.on_error)
    try:
        wait_until(lambda: c.last == ["127.0.0.2:80"])
        dnsmasq.set({})
        wait_until(lambda: any("NXDOMAIN" in e for e in c.errors), what="NXDOMAIN reported")
        assert c.updates == [["127.0.0.2:80"]]
        # back with the same address: pushed again all the same, which clears the channel's resolver error
        dnsmasq.set({"svc.test": ["127.0.0.2"]})
        wait_until(lambda: len(c.updates) == 2, what="recovery pushed")
        assert c.updates == [["127.0.0.2:80"], ["127.0.0.2:80"]]
    finally:
        r.close()


def test_ttl_drives_re_resolution_between_min_interval_and_interval(tmp_path: Path):
    d = Dnsmasq(tmp_path, ttl=1)
    d.set({"svc.test": ["127.0.0.2"]})
    d.start()
    # interval 60 s: every re-resolution seen here is the TTL's doing
    r = resolver(d.target("svc.test", 80), discovery=TimedDiscovery, interval=60, min_interval=0.1)
    times = r.discovery.times  # type: ignore[attr-defined]
    c = Collector()
    r.start(c.on_update, c.on_error)
    try:
        wait_until(lambda: c.last == ["127.0.0.2:80"])
        d.set({"svc.test": ["127.0.0.3"]})
        wait_until(lambda: c.last == ["127.0.0.3:80"], what="change seen through the 1 s TTL")
        wait_until(lambda: len(times) >= 3, what="three lookups")
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= 1.0 - 0.01 for g in gaps), gaps  # never before the TTL ran out
    finally:
        r.close()
        d.stop()


def test_requested_re_resolution_is_rate_limited_to_min_interval(tmp_path: Path):
    d = Dnsmasq(tmp_path, ttl=300)
    d.set({"svc.test": ["127.0.0.2"]})
    d.start()
    r = resolver(d.target("svc.test", 80), discovery=TimedDiscovery, interval=60, min_interval=0.5)
    times = r.discovery.times  # type: ignore[attr-defined]
    c = Collector()
    r.start(c.on_update, c.on_error)
    try:
        wait_until(lambda: c.last == ["127.0.0.2:80"])
        d.set({"svc.test": ["127.0.0.3"]})
        for _ in range(20):  # a burst of connection failures
            r.resolve_now("test")
        wait_until(lambda: c.last == ["127.0.0.3:80"], what="re-resolved on request")
        assert len(times) == 2 and times[1] - times[0] >= 0.5 - 0.01
        # the burst was one lookup; the next periodic one is 60 s away
        time.sleep(0.8)
        assert len(times) == 2
        r.resolve_now("again")
        wait_until(lambda: len(times) == 3, what="second requested lookup")
    finally:
        r.close()
        d.stop()


def test_a_failing_callback_does_not_end_the_loop(dnsmasq: Dnsmasq, caplog):  # noqa: F811
    dnsmasq.set({"svc.test": ["127.0.0.2"]})
    r = resolver(dnsmasq.target("svc.test", 80), interval=0.1, min_interval=0.1)
    c = Collector()
    calls = []

    def flaky(backends) -> None:  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("channel hiccup")
        c.on_update(backends)

    r.start(flaky, c.on_error)
    try:
        wait_until(lambda: c.last == ["127.0.0.2:80"], what="the list pushed again after the failed callback")
        assert len(calls) == 2 and "resolver callback" in caplog.text
        dnsmasq.set({"svc.test": ["127.0.0.3"]})
        wait_until(lambda: c.last == ["127.0.0.3:80"], what="later changes still pushed")
    finally:
        r.close()


async def test_close_stops_the_loop(dnsmasq: Dnsmasq):  # noqa: F811
    dnsmasq.set({"svc.test": ["127.0.0.2"]})
    r = resolver(dnsmasq.target("svc.test", 80), interval=0.1, min_interval=0.1)
    c = Collector()
    r.start(c.on_update, c.on_error)
    deadline = time.monotonic() + 20
    while not c.updates and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    r.close()
    wait = time.monotonic() + 20
    while not r._future.done() and time.monotonic() < wait:
        await asyncio.sleep(0.02)
    assert r._future.cancelled()
    r.resolve_now("after close")  # a no-op, no error
