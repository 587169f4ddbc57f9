"""Chaos scenarios of the etcd registry, shared by ``tests/chaos/test_chaos.py`` (short versions, asserted) and
``bench/chaos_report.py`` (the table and JSON): etcd down (longer or shorter than the TTL), one of two registries
down, the leader of a cluster killed, compaction under churn, a hundred publishers churning. Real etcd
(``LocalEtcd``), real backend processes, clients in this process under steady load."""

from __future__ import annotations

import contextlib
import random
import time

from harness.chaos.load import etcd_target, loaded_channel, nodes
from harness.chaos.observe import (
    History,
    LogCounter,
    close_registry,
    convergence,
    private_registry,
    registered_values,
)
from harness.chaos.result import Result
from harness.waiting import holds_within
from waypost import Publisher, _loop
from waypost.discovery import Subscriber
from waypost.etcd.local import LocalEtcd
from waypost.registries.etcd.store import EtcdRegistry


def etcd_down(etcd: LocalEtcd, down_s: float = 10.0, ttl: int = 10, key: str = "chaos-down.rpc") -> Result:
    """A single etcd stopped for ``down_s`` seconds under load, then started again. With ``down_s`` >= ``ttl``
    the publishers count their leases as lost meanwhile and register again with new ones on etcd's return."""
    r = Result(f"etcd down {down_s:g} s (TTL {ttl} s)", bound_s=2.0,
               recovery_what="registrations back after etcd returns")
    probe = private_registry(etcd.endpoints)
    try:
        with nodes(etcd.url(), key, ["a", "b"], ttl=ttl) as (a, b), \
                loaded_channel(etcd_target(etcd.endpoints, key), warm=2) as (_ch, load):
            want = {a.address, b.address}
            etcd.members[0].stop()
            time.sleep(down_s)
            close_registry(probe)
            etcd.members[0].start()
            t_back = time.monotonic()
            # a fresh client: the time measured is the publishers', not this probe's own reconnection
            probe = private_registry(etcd.endpoints)
            back = holds_within(lambda: registered_values(probe, key) == want, 30)
            r.recovery_s = round(time.monotonic() - t_back, 3)
            seen = registered_values(probe, key) or set()
            r.lost = len(want - seen)
            r.check(back, f"registrations after etcd's return: {sorted(seen)}, expected {sorted(want)}")
            r.check(r.recovery_s <= r.bound_s, f"registrations back only {r.recovery_s} s after etcd returned")
            # watches resumed: a backend registered after the return gets traffic
            with nodes(etcd.url(), key, ["late"]) as (_late,):
                t_late = time.monotonic()
                got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
                r.details["new_backend_served_after_s"] = round(time.monotonic() - t_late, 3)
                r.check(got, "a backend registered after etcd's return never got traffic (watch not resumed)")
            load.stop()
            load.fill(r)
    finally:
        close_registry(probe)
    return r


def one_of_two_registries_down(etcd: LocalEtcd, down_s: float = 10.0, ttl: int = 5,
                                key: str = "chaos-two.rpc") -> Result:
    """Two registries backing each other up (each server registered in both, each client reading both): one
    stopped for ``down_s`` seconds under load (longer than the TTL: its leases expire), then started again.
    Promise: no failed call, and the registrations are complete again in it within 2 s of its return."""
    r = Result(f"one of 2 registries down {down_s:g} s (TTL {ttl} s)", bound_s=2.0,
               recovery_what="registrations back in the returned registry")
    other = LocalEtcd().start()
    probe = None
    try:
        with nodes([etcd.url(), other.url()], key, ["a", "b"], ttl=ttl, serve=True) as (a, b), \
                loaded_channel([etcd_target(etcd.endpoints, key), etcd_target(other.endpoints, key)],
                               warm=2) as (_ch, load):
            want = {a.address, b.address}
            etcd.members[0].stop()
            time.sleep(down_s)
            etcd.members[0].start()
            t_back = time.monotonic()
            probe = private_registry(etcd.endpoints)
            back = holds_within(lambda: registered_values(probe, key) == want, 30)
            r.recovery_s = round(time.monotonic() - t_back, 3)
            seen = registered_values(probe, key) or set()
            r.lost = len(want - seen)
            r.check(back, f"registrations in the returned registry: {sorted(seen)}, expected {sorted(want)}")
            r.check(r.recovery_s <= r.bound_s, f"registrations back only {r.recovery_s} s after the registry returned")
            load.stop()
            load.fill(r)  # no failed call
    finally:
        if probe is not None:
            close_registry(probe)
        other.close()
    return r


def leader_killed(cluster: LocalEtcd, key: str = "chaos-leader.rpc", observe_s: float = 4.0) -> Result:
    """The leader of a 3-member cluster SIGKILLed under load."""
    r = Result("etcd leader killed (3 members)", bound_s=10.0, recovery_what="writes accepted again")
    probe = private_registry(cluster.endpoints)
    try:
        with nodes(cluster.url(), key, ["a", "b"]) as (a, b), \
                loaded_channel(etcd_target(cluster.endpoints, key), warm=2) as (_ch, load):
            want = {a.address, b.address}
            leader = cluster.leader()
            r.details["killed"] = leader.name
            leader.kill()
            t_kill = time.monotonic()
            # a write succeeds again once a new leader is elected
            wrote = holds_within(lambda: _try_put(probe, key + "-probe"), 30, interval=0.05)
            r.recovery_s = round(time.monotonic() - t_kill, 3)
            r.check(wrote, "no write accepted after the leader was killed")
            # registrations are checked continuously for a while (longer than nothing; the TTL is 10 s)
            worst = 0
            deadline = time.monotonic() + observe_s
            while time.monotonic() < deadline:
                seen = registered_values(probe, key)
                if seen is not None:
                    worst = max(worst, len(want - seen))
                time.sleep(0.2)
            r.lost = worst
            r.check(worst == 0, f"{worst} registrations missing after the leader was killed")
            with nodes(cluster.url(), key, ["late"]) as (_late,):
                t_late = time.monotonic()
                got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
                r.check(got, "a backend registered after the leader died never got traffic")
            load.stop()
            load.fill(r)
            r.check(r.recovery_s <= r.bound_s, f"writes resumed only after {r.recovery_s} s")
    finally:
        close_registry(probe)
    return r


def _try_put(reg: EtcdRegistry, key: str) -> bool:
    try:
        _loop.run(reg.put(key, b"x"), 1.5)
    except Exception:  # noqa: BLE001  # no leader yet: poll again
        return False
    return True


def compaction_churn(etcd: LocalEtcd, churn_s: float = 3.0, publishers: int = 12, rate: float = 20.0,
                     key: str = "chaos-compact.rpc", seed: int = 7) -> Result:
    """Publishers churn while one subscriber is cut off from etcd and the history it would need is compacted
    away; every subscriber must converge to exactly the live set."""
    from harness.tcp_proxy import TcpProxy

    r = Result("compaction under churn", bound_s=5.0, recovery_what="subscribers converged after churn stopped")
    rng = random.Random(seed)
    proxy = TcpProxy((etcd.members[0].host, etcd.members[0].client_port))
    regs = [private_registry([proxy.endpoint]), private_registry(etcd.endpoints), private_registry(etcd.endpoints)]
    pub_reg = private_registry(etcd.endpoints)
    pubs = [Publisher(pub_reg, key, f"127.0.0.1:{20000 + i}", ttl=10) for i in range(publishers)]
    subs: list[Subscriber] = []
    changes = 0
    reloads = LogCounter("waypost.discovery", "compacted")
    try:
        for p in pubs:
            p.start()
        subs = [Subscriber(reg, key) for reg in regs]
        histories = [History(lambda s=s: set(s.values())) for s in subs]
        for s, h in zip(subs, histories):
            s.add_listener(h)

        def churn(seconds: float) -> None:
            nonlocal changes
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                p = rng.choice(pubs)
                (p.pause if p.state == "running" else p.resume)()
                changes += 1
                time.sleep(1.0 / rate)

        churn(churn_s / 3)
        proxy.cut()
        churn(churn_s / 3)
        compacted_at = etcd.compact()
        r.details["compacted_at_revision"] = compacted_at
        proxy.restore()
        churn(churn_s / 3)
        t_end = time.monotonic()
        live = {p.value for p in pubs if p.state == "running"}
        took = convergence(histories, live, t_end, 30)
        converged = took is not None
        r.recovery_s = None if took is None else round(took, 3)
        r.details["changes"] = changes
        r.details["live"] = len(live)
        r.details["reloads_after_compaction"] = reloads.count
        r.check(reloads.count >= 1, "the cut subscriber never met the compaction (scenario did not exercise it)")
        wrong = [sorted(set(s.values()) ^ live) for s in subs if set(s.values()) != live]
        r.lost = sum(len(live - set(s.values())) for s in subs)
        r.check(converged, f"subscribers did not converge to the live set; differences: {wrong}")
        r.check(took is None or took <= (r.bound_s or 0), f"converged only {r.recovery_s} s after the churn stopped")
    finally:
        for s in subs:
            s.close()
        for p in pubs:
            with contextlib.suppress(Exception):
                p.stop()
        for reg in (*regs, pub_reg):
            close_registry(reg)
        proxy.close()
        reloads.close()
    return r


def publisher_churn(etcd: LocalEtcd, churn_s: float = 5.0, publishers: int = 100, rate: float = 50.0,
                    clients: int = 3, key: str = "chaos-churn.rpc", seed: int = 11) -> Result:
    """``publishers`` publishers (one helper process, one Echo server on as many ports) pause/resume at
    ``rate`` changes/s while a balanced channel calls them; every client must hold exactly the live set
    within 1 s of the churn stopping."""
    r = Result(f"{publishers} publishers churning ~{rate:g}/s", bound_s=1.0,
               recovery_what="every client holds the live set after churn stops")
    regs = [private_registry(etcd.endpoints) for _ in range(clients)]
    subs: list[Subscriber] = []
    try:
        with nodes(etcd.url(), key, ["churn"], ports=publishers) as (node,):
            subs = [Subscriber(reg, key) for reg in regs]
            with loaded_channel(etcd_target(etcd.endpoints, key), warm=publishers // 2,
                                subset_size=publishers * 2) as (ch, load):

                def views() -> list[set[str]]:
                    return [set(s.values()) for s in subs] + [{sc.address for sc in ch.balancer.subconns()}]

                histories = [History(lambda s=s: set(s.values())) for s in subs]
                for s, h in zip(subs, histories):
                    s.add_listener(h)
                chh = History(lambda: {sc.address for sc in ch.balancer.subconns()})
                ch.balancer.add_listener(chh)
                histories.append(chh)
                t_end, live = node.churn(churn_s, rate, seed)
                took = convergence(histories, live, t_end, 30)
                converged = took is not None
                r.recovery_s = None if took is None else round(took, 3)
                r.details["changes_seen_per_client"] = [len(h.changes) - 1 for h in histories]
                wrong = [sorted(v ^ live)[:5] for v in views() if v != live]
                r.lost = sum(len(live - v) for v in views())
                r.details["live"] = len(live)
                r.details["clients"] = len(subs) + 1
                load.stop()
                load.fill(r)
                r.check(converged, f"clients never converged; differences (first 5 each): {wrong}")
                r.check(took is None or took <= (r.bound_s or 0),
                        f"clients converged only {r.recovery_s} s after churn stopped")
    finally:
        for s in subs:
            s.close()
        for reg in regs:
            close_registry(reg)
    return r
