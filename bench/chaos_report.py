#!/usr/bin/env python3
"""The chaos report: every chaos scenario against real etcd and real backend processes, one table.

Scenarios (``tests/chaos_scenarios.py``, the same code ``tests/test_chaos.py`` asserts in short form):
etcd down, etcd leader killed (3 members), compaction under registration churn, 100 publishers churning
at ~50 changes/s, backend SIGKILL and SIGSTOP under load with a retryPolicy, a publisher process frozen
longer than its TTL; and (``tests/chaos_etcd_store.py``) etcd SIGKILLed and back with an older store
(data directory wiped, or restored from a snapshot), a publisher behind a link adding 0.9 s each way.
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

from tests import chaos_etcd_store as cstore
from tests import chaos_scenarios as cs
from waypost.etcd.local import LocalEtcd

# name -> (members, run(etcd, quick) -> results)
SCENARIOS: dict[str, tuple[int, Callable[[LocalEtcd, bool], list[cs.Result]]]] = {
    "etcd_down": (1, lambda e, q: [cs.etcd_down(e, down_s=3.0 if q else 10.0)]),
    "etcd_down_past_ttl": (1, lambda e, q: [cs.etcd_down(e, down_s=3.0 if q else 10.0, ttl=2 if q else 5)]),
    "leader_killed": (3, lambda e, q: [cs.leader_killed(e, observe_s=2.0 if q else 8.0)]),
    "compaction": (1, lambda e, q: [cs.compaction_churn(e, churn_s=1.5 if q else 6.0)]),
    "churn": (1, lambda e, q: [cs.publisher_churn(e, churn_s=2.0 if q else 10.0)]),
    "backend": (1, lambda e, q: cs.backend_kill_and_stop(e, stop_s=2.0 if q else 5.0)),
    "graceful_stop": (1, lambda e, q: [cs.graceful_stop(e)]),
    "frozen_publisher": (1, lambda e, q: [cs.publisher_frozen(e, ttl=2 if q else 5)]),
    "etcd_wiped": (1, lambda e, q: [cstore.etcd_store_gone_back(e, "wiped")]),
    "etcd_restored": (1, lambda e, q: [cstore.etcd_store_gone_back(e, "restored")]),
    "slow_link": (1, lambda e, q: [cstore.slow_link_publisher(e, observe_s=10.0 if q else 20.0)]),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short faults (the CI version)")
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "chaos.json"))
    args = ap.parse_args(argv)
    names = args.only or list(SCENARIOS)
    results: list[cs.Result] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="waypost-chaos-") as tmp:
        for i, name in enumerate(names):
            members, run = SCENARIOS[name]
            print(f"[{name}] running ...", flush=True)
            with LocalEtcd(members, base_dir=Path(tmp) / f"{i}-{name}") as etcd:  # started by __enter__
                try:
                    results.extend(run(etcd, args.quick))
                except Exception as e:  # noqa: BLE001  # one scenario's crash is a row, not the end
                    r = cs.Result(name)
                    r.problems.append(f"scenario raised {type(e).__name__}: {e}")
                    results.append(r)
    table = cs.fmt_table(results)
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


if __name__ == "__main__":
    raise SystemExit(main())
