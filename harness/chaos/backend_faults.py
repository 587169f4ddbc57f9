"""Chaos scenarios of the backends themselves: one SIGKILLed, one SIGSTOPped and continued, one stopped
gracefully by ``waypost.serve``, and a publisher frozen longer than its TTL. Shared by ``tests/chaos/test_chaos.py``
and ``bench/chaos_report.py``."""

from __future__ import annotations

import signal
import time

from harness.chaos.load import etcd_target, loaded_channel, nodes
from harness.chaos.observe import (
    close_registry,
    private_registry,
    registered_values,
)
from harness.chaos.result import Result
from harness.waiting import holds_within
from waypost.etcd.local import LocalEtcd


def backend_kill_and_stop(etcd: LocalEtcd, stop_s: float = 3.0, key: str = "chaos-backend.rpc") -> list[Result]:
    """Under load with a retryPolicy: one backend SIGKILLed, then another SIGSTOPped for ``stop_s`` seconds
    and continued. Recovery: the time until the victim stops getting picks."""
    kill = Result("backend SIGKILL", bound_s=3.0, recovery_what="victim out of the picker")
    stop = Result(f"backend SIGSTOP {stop_s:g} s", bound_s=5.0, recovery_what="victim out of the picker")
    with nodes(etcd.url(), key, ["a", "b", "c"]) as (a, b, _c), \
            loaded_channel(etcd_target(etcd.endpoints, key), warm=3) as (ch, load):
        sent0 = 0
        a.signal(signal.SIGKILL)
        t0 = time.monotonic()
        gone = holds_within(lambda: a.address not in ch.balancer.ready_addresses(), 20)
        kill.recovery_s = round(time.monotonic() - t0, 3)
        kill.check(gone, "killed backend still in the picker")
        time.sleep(0.5)
        with load._lock:
            kill.sent, kill.failed = load.sent - sent0, len(load.failed)
            sent0, failed0 = load.sent, len(load.failed)
        b.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            gone = holds_within(lambda: b.address not in ch.balancer.ready_addresses(), 20)
            stop.recovery_s = round(time.monotonic() - t0, 3)
            stop.check(gone, "frozen backend still in the picker")
            time.sleep(max(0.0, stop_s - (time.monotonic() - t0)))
        finally:
            b.signal(signal.SIGCONT)
        t_cont = time.monotonic()
        back = holds_within(lambda: "b" in load.servers_after(t_cont), 30)
        stop.details["served_again_after_s"] = round(time.monotonic() - t_cont, 3)
        stop.check(back, "continued backend never served again")
        load.stop()
        stop.sent, stop.failed = load.sent - sent0, len(load.failed) - failed0
    for res in (kill, stop):
        res.check(res.failed == 0, f"{res.failed} of {res.sent} RPCs failed: {load.failed[:3]}")
        res.check(res.recovery_s is not None and res.recovery_s <= (res.bound_s or 0),
                  f"victim left the picker only after {res.recovery_s} s")
    return [kill, stop]


def graceful_stop(etcd: LocalEtcd, key: str = "chaos-graceful.rpc") -> Result:
    """A backend run by ``waypost.serve`` stopped gracefully (its own stop sequence: deregister, NOT_SERVING,
    refuse new calls, drain) while the clients call it without pause: no call may fail."""
    r = Result("backend graceful stop (serve)", bound_s=3.0, recovery_what="victim out of the picker")
    with nodes(etcd.url(), key, ["a", "b", "victim"], serve=True) as (_a, _b, victim), \
            loaded_channel(etcd_target(etcd.endpoints, key), warm=3) as (ch, load):
        t0 = time.monotonic()
        stopped = victim.quit()
        r.check(stopped, "the victim did not finish its graceful stop in time")
        gone = holds_within(lambda: victim.address not in ch.balancer.ready_addresses(), 20)
        r.recovery_s = round(time.monotonic() - t0, 3)
        r.check(gone, "the stopped backend is still in the picker")
        time.sleep(0.5)
        load.stop()
        load.fill(r)
        r.check(r.recovery_s <= (r.bound_s or 0), f"left the picker only after {r.recovery_s} s")
    return r


def publisher_frozen(etcd: LocalEtcd, ttl: int = 2, key: str = "chaos-frozen.rpc") -> Result:
    """A backend process (with its publisher) SIGSTOPped longer than its TTL, then continued: its lease
    expires meanwhile; it must be registered again within 2 s of SIGCONT, with no failed RPC."""
    r = Result(f"publisher SIGSTOP > TTL ({ttl} s)", bound_s=2.0, recovery_what="registered again after SIGCONT")
    probe = private_registry(etcd.endpoints)
    try:
        with nodes(etcd.url(), key, ["frozen", "steady"], ttl=ttl) as (frozen, steady), \
                loaded_channel(etcd_target(etcd.endpoints, key), warm=2) as (_ch, load):
            frozen.signal(signal.SIGSTOP)
            try:
                expired = holds_within(lambda: frozen.address not in (registered_values(probe, key) or {frozen.address}),
                                   ttl + 15)
                r.check(expired, "the frozen publisher's lease never expired")
                time.sleep(0.5)
            finally:
                frozen.signal(signal.SIGCONT)
            t_cont = time.monotonic()
            back = holds_within(lambda: frozen.address in (registered_values(probe, key) or set()), 20)
            r.recovery_s = round(time.monotonic() - t_cont, 3)
            r.check(back, "the continued publisher never registered again")
            r.check(r.recovery_s <= r.bound_s, f"registered again only {r.recovery_s} s after SIGCONT")
            served = holds_within(lambda: "frozen" in load.servers_after(t_cont), 30)
            r.check(served, "the continued backend never got traffic again")
            seen = registered_values(probe, key) or set()
            r.lost = len({frozen.address, steady.address} - seen)
            load.stop()
            load.fill(r)
    finally:
        close_registry(probe)
    return r
