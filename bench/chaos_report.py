#!/usr/bin/env python3
"""The chaos report: every chaos scenario against real etcd and real backend processes, one table.

Scenarios (``harness/chaos/``: etcd_faults, backend_faults, partition, consul_restart; the same code
``tests/chaos/test_chaos.py`` asserts in short form): etcd down, etcd leader killed (3 members), compaction under registration churn, 100 publishers churning
at ~50 changes/s, backend SIGKILL and SIGSTOP under load with a retryPolicy, a publisher process frozen
longer than its TTL, a process forking 8 children per round after dialing an etcd target (gunicorn/uWSGI
preload); and (``harness/chaos/etcd_store.py``) etcd SIGKILLed and back with an older store (data directory
wiped, or restored from a snapshot), a publisher behind a link adding 0.9 s each way; two registries backing each
other up (servers registered in both, clients reading both), one of them down; one member of a 3-member cluster
cut off from the other two while the clients talk to it (``harness/etcd_partition.py``).
A Consul server agent (data dir kept) restarted under load, down longer than its instances' TTL.
Columns: RPCs sent and failed, registrations lost, recovery time (what "recovery" means per scenario
is in the JSON as ``recovery_what``) and its bound.

Usage: python bench/chaos_report.py [--quick] [--only NAME ...] [--out PATH]
Full run ~3.5 min (etcd down 10 s); ``--quick`` (CI) ~1.5 min. Figures go to bench/results/chaos.json.
Exit status 1 if any scenario broke its promise. Runs from a source checkout (no install needed
beyond the dev dependencies).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "src", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from harness.chaos import etcd_store as cstore
from harness.chaos import partition
from harness.chaos.backend_faults import backend_kill_and_stop, graceful_stop, publisher_frozen
from harness.chaos.consul_restart import consul_agent_restart
from harness.chaos.etcd_faults import (
    compaction_churn,
    etcd_down,
    leader_killed,
    one_of_two_registries_down,
    publisher_churn,
)
from harness.chaos.result import Result, fmt_table
from harness.etcd_partition import PartitionCluster
from waypost.etcd.local import LocalEtcd

# name -> (members, run(etcd, quick) -> results)
SCENARIOS: dict[str, tuple[int, Callable[[LocalEtcd, bool], list[Result]]]] = {
    "etcd_down": (1, lambda e, q: [etcd_down(e, down_s=3.0 if q else 10.0)]),
    "etcd_down_past_ttl": (1, lambda e, q: [etcd_down(e, down_s=3.0 if q else 10.0, ttl=2 if q else 5)]),
    "leader_killed": (3, lambda e, q: [leader_killed(e, observe_s=2.0 if q else 8.0)]),
    "compaction": (1, lambda e, q: [compaction_churn(e, churn_s=1.5 if q else 6.0)]),
    "churn": (1, lambda e, q: [publisher_churn(e, churn_s=2.0 if q else 10.0)]),
    "backend": (1, lambda e, q: backend_kill_and_stop(e, stop_s=2.0 if q else 5.0)),
    "graceful_stop": (1, lambda e, q: [graceful_stop(e)]),
    "frozen_publisher": (1, lambda e, q: [publisher_frozen(e, ttl=2 if q else 5)]),
    "etcd_wiped": (1, lambda e, q: [cstore.etcd_store_gone_back(e, "wiped")]),
    "etcd_restored": (1, lambda e, q: [cstore.etcd_store_gone_back(e, "restored")]),
    "slow_link": (1, lambda e, q: [cstore.slow_link_publisher(e, observe_s=10.0 if q else 20.0)]),
    "two_registries": (1, lambda e, q: [one_of_two_registries_down(e, down_s=3.0 if q else 10.0, ttl=2 if q else 5)]),
}


def partitioned_member(base_dir: Path, quick: bool) -> list[Result]:
    """A 3-member cluster behind peer relays (``harness/etcd_partition.py``), one member cut off under load."""
    with PartitionCluster(3, base_dir=base_dir) as pc:
        return [partition.partitioned_member(pc, partition_s=4.0 if quick else 8.0)]


# name -> run(base_dir, quick) -> results: scenarios that start an etcd of their own
OWN_ETCD: dict[str, Callable[[Path, bool], list[Result]]] = {
    "partitioned_member": partitioned_member,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short faults (the CI version)")
    ap.add_argument("--only", nargs="*", choices=sorted([*SCENARIOS, *OWN_ETCD]), help="run only these scenarios")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "chaos.json"))
    args = ap.parse_args(argv)
    names = args.only or [*SCENARIOS, *OWN_ETCD]
    results: list[Result] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="waypost-chaos-") as tmp:
        for i, name in enumerate(names):
            print(f"[{name}] running ...", flush=True)
            base = Path(tmp) / f"{i}-{name}"
            try:
                if name in OWN_ETCD:
                    results.extend(OWN_ETCD[name](base, args.quick))
                    continue
                members, run = SCENARIOS[name]
                with LocalEtcd(members, base_dir=base) as etcd:  # started by __enter__
                    results.extend(run(etcd, args.quick))
            except Exception as e:  # noqa: BLE001  # one scenario's crash is a row, not the end
                r = Result(name)
                r.problems.append(f"scenario raised {type(e).__name__}: {e}")
                results.append(r)
    table = fmt_table(results)
    print(table)
    out = {
        "quick": args.quick,
        "seconds": round(time.monotonic() - t0, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": [r.as_dict() for r in results],
        "table": table.splitlines(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r.ok for r in results) else 1


# ---- fork (gunicorn/uWSGI preload) --------------------------------------------------------------------


def fork_children(etcd: LocalEtcd, quick: bool) -> list[Result]:
    """A process dials an etcd target, calls, then forks 8 children per round. Each child calls on the
    inherited channel and on a fresh dial (2 calls; a crashed or hung child counts both as failed and as
    lost). The parent calls after every round. recovery = slowest round, from the first fork to the last
    child's exit; details: per-round ok/crashed and the longest os.fork() (it includes the pause of the
    parent's etcd streams)."""
    import os
    import signal

    import waypost
    from harness.backends import echo_pb2, echo_pb2_grpc
    from harness.backends.procs import EchoProcess

    rounds, children = (2, 8) if quick else (5, 8)
    r = Result(f"fork {children} children x {rounds} rounds", bound_s=20.0,
                  recovery_what="slowest round: first fork -> last child exited")
    be = EchoProcess("a")
    try:
        etcd.etcdctl("put", "fork.rpc/a", be.address)
        target = f"etcd:///{etcd.endpoint}?key=fork.rpc"
        with waypost.dial(target) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            stub.Unary(echo_pb2.EchoRequest(), timeout=10)

            def child() -> int:
                failed = 0
                for make in (lambda: ch, lambda: waypost.dial(target)):
                    try:
                        echo_pb2_grpc.EchoStub(make()).Unary(echo_pb2.EchoRequest(), timeout=10)
                    except Exception:  # noqa: BLE001  # counted: the exit code is the number of failures
                        failed += 1
                return failed

            rounds_out, slowest, fork_ms = [], 0.0, 0.0
            for _ in range(rounds):
                t0 = time.monotonic()
                pids = []
                for _ in range(children):
                    f0 = time.monotonic()
                    pid = os.fork()
                    if pid == 0:
                        code = 2
                        try:
                            signal.alarm(30)
                            code = child()
                        finally:
                            os._exit(code)
                    fork_ms = max(fork_ms, (time.monotonic() - f0) * 1e3)
                    pids.append(pid)
                ok = crashed = 0
                deadline = time.monotonic() + 40
                for pid in pids:
                    while not (res := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
                        time.sleep(0.01)
                    if not res[0]:
                        os.kill(pid, signal.SIGKILL)
                        res = os.waitpid(pid, 0)
                    status = res[1]
                    r.sent += 2
                    if os.WIFEXITED(status):
                        r.failed += os.WEXITSTATUS(status)
                        ok += os.WEXITSTATUS(status) == 0
                    else:
                        r.failed += 2
                        r.lost += 1
                        crashed += 1
                slowest = max(slowest, time.monotonic() - t0)
                rounds_out.append({"ok": ok, "crashed": crashed, "children": children})
                r.sent += 1
                try:
                    stub.Unary(echo_pb2.EchoRequest(), timeout=10)
                except Exception:  # noqa: BLE001
                    r.failed += 1
            r.recovery_s = round(slowest, 2)
            r.details = {"rounds": rounds_out, "max_fork_ms": round(fork_ms, 1)}
    finally:
        be.kill()
    r.check(r.failed == 0, f"{r.failed} calls failed ({r.lost} children crashed or hung)")
    r.check(r.recovery_s is not None and r.recovery_s <= (r.bound_s or 0), "a round took longer than its bound")
    return [r]


SCENARIOS["fork"] = (1, lambda e, q: fork_children(e, q))


# ---- consul agent restart (a persistent server agent of its own; the etcd started for it is not used) -------


def consul_restart(etcd: LocalEtcd, quick: bool) -> list[Result]:
    return [consul_agent_restart(down_s=7.0 if quick else 10.0, ttl=5, base_dir=etcd.base_dir / "consul")]


SCENARIOS["consul_restart"] = (1, consul_restart)

if __name__ == "__main__":
    raise SystemExit(main())
