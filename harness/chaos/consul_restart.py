"""The chaos scenario of a Consul registry: a persistent server agent restarted under load (its catalog comes
back with every instance critical until its publisher passes its check again). Shared by
``tests/chaos/test_chaos.py`` and ``bench/chaos_report.py``."""

from __future__ import annotations

import os
import time

from harness.chaos.load import loaded_channel, nodes
from harness.chaos.result import Result
from harness.waiting import holds_within


def consul_agent_restart(down_s: float = 10.0, ttl: int = 5, key: str = "chaos-consul",
                         base_dir: str | os.PathLike[str] | None = None) -> Result:
    """A Consul server agent that keeps its data dir (not -dev), stopped with SIGTERM for ``down_s`` seconds
    under load and started again with the same data. Two backend processes registered by ``waypost.serve``
    (ConsulPublisher, TTL ``ttl`` s), clients reading ``consul://agent/key``. With ``down_s`` > ``ttl`` the agent
    comes back with both instances in its catalog but critical until each publisher passes its check again; a
    resolver reading in that moment must keep the last list. Promise: no failed call, the instances passing
    again within 5 s of the agent's return, and a backend registered afterwards gets traffic."""
    from harness import consul_agent

    r = Result(f"consul agent restart, down {down_s:g} s (TTL {ttl} s)", bound_s=5.0,
               recovery_what="instances passing again after the agent returns")
    with consul_agent.ConsulAgent(base_dir, persistent=True) as agent, \
            nodes(agent.url, key, ["a", "b"], ttl=ttl, serve=True) as (a, b), \
            loaded_channel(f"consul://{agent.address}/{key}", warm=2) as (ch, load):
        want = sorted([a.address, b.address])
        agent.stop()  # SIGTERM
        time.sleep(down_s)
        agent.start()  # same data dir: services, checks and catalog come back
        t_back = time.monotonic()

        def passing() -> list[str] | None:
            """Passing in the agent's own state and in the catalog clients read (which, right after the start,
            can still show the passing state saved before the stop)."""
            try:
                local = agent.locally_passing_addresses(key)
                return local if agent.passing_addresses(key) == local else None
            except Exception:  # noqa: BLE001  # not answering yet: asked again
                return None

        back = holds_within(lambda: passing() == want, 30)
        r.recovery_s = round(time.monotonic() - t_back, 3)
        seen = passing() or []
        r.lost = len(set(want) - set(seen))
        r.check(back, f"passing instances after the agent's return: {seen}, expected {want}")
        r.check(r.recovery_s <= (r.bound_s or 0), f"instances passing again only {r.recovery_s} s after the return")
        # the client follows: both served again before the next change (a backend joining while they were still
        # critical would be the whole list, and its leaving would leave none)
        both = holds_within(lambda: sorted(ch.balancer.ready_addresses()) == want, 10)
        r.details["channel_has_both_after_s"] = round(time.monotonic() - t_back, 3)
        r.check(both, f"the channel holds {sorted(ch.balancer.ready_addresses())} after the agent's return, "
                      f"expected {want}")
        with nodes(agent.url, key, ["late"], ttl=ttl, serve=True) as (_late,):
            t_late = time.monotonic()
            got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
            r.details["new_backend_served_after_s"] = round(time.monotonic() - t_late, 3)
            r.check(got, "a backend registered after the agent's return never got traffic")
        load.stop()
        r.details["agent_startup_s"] = round(agent.startup_seconds or 0.0, 3)
        r.details["empty_answers_held"] = ch._resolver.discovery.empty.holds
        load.fill(r)
    return r
