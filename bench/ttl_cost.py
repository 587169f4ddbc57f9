"""What a lease TTL costs: keepalive requests per second and CPU per publisher, for TTL 2, 5, 10, 30 s.

For each TTL, ``--publishers`` (default 100) ``waypost.Publisher`` instances in this process register
one address each in a real local etcd (started by this script, ``waypost.etcd.local``), then the script
measures over ``--seconds`` (default 20):

- etcd's own count of LeaseKeepAlive messages received (``grpc_server_msg_received_total`` for
  ``grpc_method="LeaseKeepAlive"`` from its ``/metrics``): renewals per second, total and per publisher;
- this process's CPU time (all threads: the control loop, grpc's) per publisher, as a share of a core;
- the etcd process's CPU time per publisher (from ``/proc``).

Both CPU figures are net of an idle window first (connected, nothing registered).

Registration happens before the window; the publishers are stopped (leases revoked) after it. Bounded:
at most ``len(ttls) * (seconds + ~5)`` seconds. Prints one line per TTL and writes
bench/results/ttl_cost.json. Run it on a quiet machine (``nice`` changes nothing in the request counts,
only in the CPU figures' noise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import waypost
from waypost import _loop
from waypost.etcd.local import LocalEtcd

_KEEPALIVE = re.compile(r'^grpc_server_msg_received_total\{[^}]*grpc_method="LeaseKeepAlive"[^}]*\}\s+(\S+)$', re.MULTILINE)


def keepalives_received(client_url: str) -> float:
    with urllib.request.urlopen(client_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in _KEEPALIVE.findall(text))


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def window(node: LocalEtcd, seconds: float) -> tuple[float, float, float, float]:
    """(keepalives received, this process's CPU s, etcd's CPU s, wall s) over ``seconds``."""
    member = node.members[0]
    assert member.proc is not None
    k0, c0, e0, t0 = (keepalives_received(member.client_url), time.process_time(),
                      proc_cpu_seconds(member.proc.pid), time.monotonic())
    time.sleep(seconds)
    k1, c1, e1, t1 = (keepalives_received(member.client_url), time.process_time(),
                      proc_cpu_seconds(member.proc.pid), time.monotonic())
    return k1 - k0, c1 - c0, e1 - e0, t1 - t0


def measure(node: LocalEtcd, ttl: int, publishers: int, seconds: float, idle: tuple[float, float]
            ) -> dict[str, float]:
    """``idle``: (this process's, etcd's) CPU share of a core with no publisher, subtracted."""
    reg = waypost.connect(node.url())
    pubs = [waypost.Publisher(reg, f"bench-ttl{ttl}.rpc", f"10.0.{i // 250}.{i % 250 + 1}:8080", ttl=ttl)
            for i in range(publishers)]
    for p in pubs:
        p.start()
    try:
        time.sleep(min(ttl / 3, 2.0))  # past the first renewals after the grants
        keepalives, cpu, etcd_cpu, took = window(node, seconds)
    finally:
        for p in pubs:
            p.stop()
    return {
        "ttl": ttl, "publishers": publishers, "seconds": round(took, 2),
        "keepalives_per_s": round(keepalives / took, 2),
        "keepalives_per_s_per_publisher": round(keepalives / took / publishers, 4),
        "client_cpu_pct_per_publisher": round(100 * (cpu / took - idle[0]) / publishers, 4),
        "etcd_cpu_pct_per_publisher": round(100 * (etcd_cpu / took - idle[1]) / publishers, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--publishers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0, help="measuring window per TTL (at most 120)")
    ap.add_argument("--ttls", default="2,5,10,30", help="comma-separated TTLs in seconds")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ttl_cost.json"))
    args = ap.parse_args(argv)
    if not 1 <= args.publishers <= 5000:
        ap.error("--publishers must be between 1 and 5000")
    if not 1 <= args.seconds <= 120:
        ap.error("--seconds must be between 1 and 120")
    ttls = [int(t) for t in args.ttls.split(",")]
    rows = []
    with LocalEtcd(1) as node:
        waypost.connect(node.url()).sync.get("bench-idle")  # connected, nothing registered
        _, cpu, etcd_cpu, took = window(node, min(args.seconds, 10.0))
        idle = (cpu / took, etcd_cpu / took)
        print(f"idle: client CPU {100 * idle[0]:.2f}%, etcd CPU {100 * idle[1]:.2f}% of a core (subtracted below)")
        for ttl in ttls:
            row = measure(node, ttl, args.publishers, args.seconds, idle)
            rows.append(row)
            print(f"ttl {ttl:>2}s: {row['keepalives_per_s']:>7.2f} keepalives/s "
                  f"({row['keepalives_per_s_per_publisher']:.3f} per publisher), client CPU "
                  f"{row['client_cpu_pct_per_publisher']:.4f}% of a core per publisher, etcd CPU "
                  f"{row['etcd_cpu_pct_per_publisher']:.4f}% per publisher", flush=True)
        _loop.run(waypost.connect(node.url()).close(), 10)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"publishers": args.publishers, "idle_cpu_pct": {
        "client": round(100 * idle[0], 3), "etcd": round(100 * idle[1], 3)}, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
