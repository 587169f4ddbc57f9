"""The chaos scenario of an etcd member cut off from the majority (``harness/etcd_partition.py``) while every
client talks to it; and how to make a client talk to a given member. Shared by ``tests/chaos/test_chaos.py`` and
``bench/chaos_report.py``."""

from __future__ import annotations

import time

import waypost
from harness.chaos.load import etcd_target, loaded_channel, nodes
from harness.chaos.observe import (
    close_registry,
    private_registry,
    registered_values,
)
from harness.chaos.result import Result
from harness.etcd_partition import PartitionCluster
from harness.waiting import holds_within, wait_until
from waypost import _loop
from waypost.discovery import Subscriber
from waypost.etcd.config import EtcdConfig
from waypost.registries.etcd.store import EtcdRegistry


def pin_member(reg: EtcdRegistry, address: str, tries: int = 50) -> None:
    """Make ``address`` the member ``reg``'s client uses (connected), as the first of its list would be had it
    connected first (another one may connect sooner)."""
    async def pin() -> str:
        pool = reg.client.pool
        pool._current = next(i for i, ep in enumerate(pool.endpoints) if ep.address == address)
        await reg.client.range(b"pin", serializable=True)
        return await _uses(reg)

    for _ in range(tries):
        if _loop.run(pin(), 10) == address:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{reg!r} does not settle on {address}")


async def _uses(reg: EtcdRegistry) -> str:
    """The member ``reg``'s unary calls go to now."""
    pool = reg.client.pool
    return pool.endpoints[pool._current].address


def partitioned_member(pc: PartitionCluster, partition_s: float = 8.0, key: str = "chaos-partition.rpc",
                       request_timeout: float = 10.0) -> Result:
    """One member of a 3-member cluster cut off from the other two (``harness/etcd_partition.py``) for
    ``partition_s`` seconds under load, while every client talks to it: it is listed first by the backends'
    publishers, the loaded channel's resolver and a subscriber, all with ``request_timeout`` (10 s: one
    attempt on a member would outlast the callers' own budgets). A backend registered during the partition,
    through the isolated member first, must get traffic; no call may fail, no registration may go, and after
    the heal and that backend's stop every view holds the three others again."""
    r = Result(f"etcd member partitioned {partition_s:g} s (3 members)", bound_s=10.0,
               recovery_what="a backend registered during the partition is served")
    iso = pc.follower()
    others = [i for i in range(len(pc.endpoints)) if i != iso]
    eps = [pc.endpoints[i] for i in [iso, *others]]
    opts = f"request_timeout={request_timeout:g}"
    reg_url = f"etcd://{','.join(eps)}?{opts}"
    probe = private_registry([pc.endpoints[i] for i in others])  # reads through the healthy members
    view = EtcdRegistry(EtcdConfig(endpoints=tuple(eps), request_timeout=request_timeout))
    sub = None
    shared = waypost.connect(reg_url)  # the registry the channel's resolver and the nodes' URL share (same settings)
    try:
        for reg in (view, shared):  # they talk to the member to be cut off, their watches included
            pin_member(reg, eps[0])
        sub = Subscriber(view, key)  # watching well before the cut
        with nodes(reg_url, key, ["a", "b", "c"]) as trio, \
                loaded_channel(f"{etcd_target(eps, key)}&{opts}", warm=3) as (ch, load):
            want = {n.address for n in trio}
            wait_until(lambda: set(sub.values()) == want, 20, "the subscriber sees the three backends")
            r.details["isolated"] = pc.etcd.members[iso].name
            r.details["clients_on_it"] = [_loop.run(_uses(reg)) == eps[0] for reg in (view, shared)]
            t_cut = time.monotonic()
            pc.isolate(iso)
            r.details["member_leaderless_after_s"] = round(pc.wait_leaderless(iso), 3)
            with nodes(reg_url, key, ["late"]) as (late,):
                served = holds_within(lambda: "late" in load.servers_after(t_cut), 30)
                r.recovery_s = round(time.monotonic() - t_cut, 3)
                r.check(served, "a backend registered during the partition never got traffic")
                seen_late = holds_within(lambda: late.address in sub.values(), 20)
                r.details["subscriber_saw_it_after_s"] = round(time.monotonic() - t_cut, 3)
                r.check(seen_late, "the subscriber never saw the backend registered during the partition")
                worst = 0  # registrations are checked through the healthy members until the heal
                while time.monotonic() < t_cut + partition_s:
                    seen = registered_values(probe, key)
                    if seen is not None:
                        worst = max(worst, len(want - seen))
                    time.sleep(0.2)
                r.lost = worst
                r.check(worst == 0, f"{worst} registrations missing during the partition")
                pc.heal()
                t_heal = time.monotonic()
            # "late" deregistered on leaving the block: every view converges on the three others
            converged = holds_within(lambda: set(sub.values()) == want
                                     and set(ch.balancer.ready_addresses()) == want, 30)
            r.details["views_converged_after_heal_s"] = round(time.monotonic() - t_heal, 3)
            r.check(converged, f"views after the heal: subscriber {sorted(sub.values())}, channel "
                               f"{sorted(ch.balancer.ready_addresses())}, expected {sorted(want)}")
            load.stop()
            load.fill(r)
            r.check(r.recovery_s <= (r.bound_s or 0), f"the new backend was served only after {r.recovery_s} s")
    finally:
        pc.heal()
        if sub is not None:
            sub.close()
        for reg in (view, probe, shared):
            close_registry(reg)
    return r
