#!/usr/bin/env python3
"""Discovery benchmarks against a real local etcd, each beside its raw-etcd baseline in the same run.

1. propagation: ``Publisher.start()`` -> a Subscriber's listener fires, beside a raw ``put`` -> watch
   event and a raw ``grant`` + ``put`` -> watch event (the two etcd writes a registration needs; each
   is a raft write with an fsync), same client, same thread hop, interleaved round by round, median and
   p99 over ``--iterations`` rounds;
2. load: a Subscriber's initial load of ``--endpoints`` registrations under one key (construction
   until ``backends()`` and ``values()`` return them all), beside a raw prefix Get of the same keys
   (``Registry.get``: with etcd its KeyValues are built lazily, so this is the RPC and the parse),
   best of ``--load-rounds`` each, and the process RSS it adds;
3. scale: ``--publishers`` Publishers in one process: how many TCP connections to etcd and how many
   LeaseKeepAlive streams they use (from etcd's own metrics), and the CPU per publisher while idle.

Usage: python bench/discovery.py [--iterations N] [--endpoints N] [--load-rounds N] [--publishers N]
       [--window S] [--out PATH] [--only load]
The last lines are the ratios; the figures go to bench/results/discovery.json. Default run < 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from waypost import Publisher, _loop
from waypost.discovery import Subscriber
from waypost.discovery.connections import connect
from waypost.discovery.store import Registry
from waypost.etcd.local import LocalEtcd


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ms(x: float) -> float:
    return round(x * 1000, 3)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    return int(m.group(1)) if m else 0


def tcp_connections_to(port: int) -> int:
    """Established TCP connections of this process whose remote port is ``port`` (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            rem_port = int(parts[2].rsplit(":", 1)[1], 16)
            if rem_port == port and parts[3] == "01" and parts[9] in inodes:
                n += 1
    return n


def etcd_metric(url: str, name: str, labels: str = "") -> float:
    """Sum of an etcd Prometheus metric whose label set contains ``labels``."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line):
            rest = line[len(name):]
            if rest[:1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until(cond: Any, event: threading.Event, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        event.wait(1)
        event.clear()


def propagation(reg: Registry, iterations: int) -> dict[str, Any]:
    """Raw put -> watch event and Publisher.start() -> listener, interleaved round by round so both
    see the same machine noise; both go through the same client and the same thread hop."""
    seen: dict[str, float] = {}
    arrived = threading.Event()
    # from an explicit revision: a watch "from now" may start after the first put
    start = _loop.run(reg.get("bench.raw/", prefix=True, count_only=True), 10).revision + 1
    watch = reg.watch("bench.raw/", prefix=True, start_revision=start)

    async def reader() -> None:
        async for batch in watch:
            now = time.perf_counter()
            for ev in batch:
                if ev.type == "put":
                    seen[ev.kv.key] = now
            arrived.set()

    task = _loop.submit(reader())
    sub = Subscriber(reg, "bench.prop")
    fired_at: list[float] = []
    changed = threading.Event()

    def listener() -> None:
        fired_at.append(time.perf_counter())
        changed.set()

    sub.add_listener(listener)
    _loop.run(asyncio.sleep(0), 5)  # the listener is registered on the loop
    raw: list[float] = []
    raw_lease: list[float] = []
    pub_times: list[float] = []
    for i in range(iterations):
        key = f"bench.raw/{i}"
        arrived.clear()
        t0 = time.perf_counter()
        _loop.run(reg.put(key, b"127.0.0.1:9999"), 10)
        wait_until(lambda key=key: key in seen, arrived, f"the watch event of {key}")
        raw.append(seen[key] - t0)

        # the same two etcd writes a publisher needs (lease grant, then put under it), without waypost
        key = f"bench.raw/lease-{i}"
        arrived.clear()
        t0 = time.perf_counter()
        lease = _loop.run(reg.grant(10), 10)
        _loop.run(reg.put(key, b"127.0.0.1:9999", lease=lease), 10)
        wait_until(lambda key=key: key in seen, arrived, f"the watch event of {key}")
        raw_lease.append(seen[key] - t0)
        _loop.run(reg.revoke(lease), 10)

        addr = f"127.0.0.1:{10000 + i}"
        pub = Publisher(reg, "bench.prop", addr, ttl=10)
        fired_at.clear()
        changed.clear()
        t0 = time.perf_counter()
        pub.start()
        wait_until(lambda addr=addr: addr in sub.values(), changed, f"{addr} to appear")
        pub_times.append(fired_at[0] - t0)
        pub.stop()
        wait_until(lambda: not sub.values(), changed, f"{addr} to go")
    sub.close()
    watch.cancel()
    task.result(10)
    _loop.run(reg.delete("bench.raw/", prefix=True), 10)
    return {
        "iterations": iterations,
        "raw_put_to_watch_ms": {"median": ms(statistics.median(raw)), "p99": ms(pct(raw, 0.99))},
        "raw_grant_put_to_watch_ms": {
            "median": ms(statistics.median(raw_lease)), "p99": ms(pct(raw_lease, 0.99)),
        },
        "publisher_start_to_listener_ms": {
            "median": ms(statistics.median(pub_times)), "p99": ms(pct(pub_times, 0.99)),
        },
    }


def load(reg: Registry, endpoints: int, rounds: int = 5) -> dict[str, Any]:
    """Best of ``rounds`` for both (the machine is noisy; the minimum is the cost without noise),
    raw and subscriber interleaved round by round so both see the same noise."""
    async def fill() -> None:
        for start in range(0, endpoints, 500):
            await asyncio.gather(*(
                reg.put(f"bench.big/{i}", f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:8080".encode())
                for i in range(start, min(endpoints, start + 500))
            ))

    def raw_get() -> float:
        t0 = time.perf_counter()
        res = _loop.run(reg.get("bench.big/", prefix=True), 60)
        took = time.perf_counter() - t0
        assert len(res.kvs) == endpoints
        return took

    _loop.run(fill(), 300)
    raw, subs = [raw_get()], []  # the allocator grows for a response this size before RSS is read
    gc.collect()
    rss_before = rss_kib()
    for i in range(rounds):
        if i:
            raw.append(raw_get())
        t0 = time.perf_counter()
        sub = Subscriber(reg, "bench.big", timeout=60)
        backends, values = sub.backends(), sub.values()  # ready means both are there to read
        subs.append(time.perf_counter() - t0)
        assert len(backends) == len(values) == endpoints
        del backends, values
        rss_with = rss_kib()
        sub.close()
    _loop.run(reg.delete("bench.big/", prefix=True), 60)
    return {
        "endpoints": endpoints,
        "rounds": rounds,
        "raw_prefix_get_ms": ms(min(raw)),
        "subscriber_initial_load_ms": ms(min(subs)),
        "ratio_median_of_rounds": round(statistics.median(s / r for s, r in zip(subs, raw)), 2),
        "rss_total_kib": rss_with,
        "rss_added_by_subscriber_kib": rss_with - rss_before,
    }


def scale(reg: Registry, node: LocalEtcd, publishers: int, window: float) -> dict[str, Any]:
    url = node.members[0].client_url
    port = int(url.rsplit(":", 1)[1])
    def active(method: str) -> int:
        """Streams open now on etcd: started minus handled (go-grpc-prometheus counters)."""
        label = f'grpc_method="{method}"'
        return int(etcd_metric(url, "grpc_server_started_total", label)
                   - etcd_metric(url, "grpc_server_handled_total", label))

    # CPU of this process while idle with no publishers, to subtract
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(window)
    base_cpu, base_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    pubs = [Publisher(reg, "bench.many", f"127.0.0.1:{20000 + i}", ttl=10) for i in range(publishers)]

    async def start_all() -> None:
        await asyncio.gather(*(p.astart() for p in pubs))

    t0 = time.perf_counter()
    _loop.run(start_all(), 300)
    started_in = time.perf_counter() - t0
    count = _loop.run(reg.get("bench.many/", prefix=True, count_only=True), 30).count
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(window)  # keepalives run (every ttl/3) on the control loop
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    still = sum(p.registered for p in pubs)
    conns = tcp_connections_to(port)
    streams = active("LeaseKeepAlive")
    watch_streams = active("Watch")
    watchers = etcd_metric(url, "etcd_debugging_mvcc_watcher_total")

    async def stop_all() -> None:
        await asyncio.gather(*(p.astop() for p in pubs))

    _loop.run(stop_all(), 300)
    return {
        "publishers": publishers,
        "registered": count,
        "still_registered_after_window": still,
        "start_all_s": round(started_in, 3),
        "tcp_connections_to_etcd": conns,
        "lease_keepalive_streams": streams,
        "watch_streams": watch_streams,
        "etcd_watchers": int(watchers),
        "idle_window_s": round(wall, 3),
        "idle_cpu_s": round(cpu, 4),
        "baseline_idle_cpu_s": round(base_cpu * wall / base_wall, 4),
        "cpu_us_per_publisher_per_s": round(max(0.0, cpu - base_cpu * wall / base_wall) / wall / publishers * 1e6, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--endpoints", type=int, default=10_000)
    ap.add_argument("--load-rounds", type=int, default=10, help="initial loads timed (the best counts)")
    ap.add_argument("--publishers", type=int, default=1_000)
    ap.add_argument("--window", type=float, default=5.0, help="idle seconds measured with all publishers up")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "discovery.json"))
    ap.add_argument("--only", choices=("load",), help="run only this part (prints its line, writes nothing)")
    args = ap.parse_args()
    if args.only == "load":
        with tempfile.TemporaryDirectory(prefix="waypost-bench-") as tmp, LocalEtcd(1, base_dir=Path(tmp)) as node:
            reg = connect(node.url())
            try:
                big = load(reg, args.endpoints, args.load_rounds)
            finally:
                _loop.run(reg.close(), 10)
        print("load", json.dumps(big), flush=True)
        return 0

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="waypost-bench-") as tmp, LocalEtcd(1, base_dir=Path(tmp)) as node:
        reg = connect(node.url())
        try:
            prop = propagation(reg, args.iterations)
            print("propagation", json.dumps(prop), flush=True)
            big = load(reg, args.endpoints, args.load_rounds)
            print("load", json.dumps(big), flush=True)
            many = scale(reg, node, args.publishers, args.window)
            print("scale", json.dumps(many), flush=True)
        finally:
            _loop.run(reg.close(), 10)
    result = {"propagation": prop, "load": big, "scale": many,
              "total_s": round(time.perf_counter() - t_start, 1), "python": sys.version.split()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    raw, pub = prop["raw_put_to_watch_ms"], prop["publisher_start_to_listener_ms"]
    raw2 = prop["raw_grant_put_to_watch_ms"]
    print(f"propagation p99: publisher {pub['p99']} ms vs raw put {raw['p99']} ms "
          f"(+{pub['p99'] - raw['p99']:.2f} ms, goal <= +5 ms); median ratio {pub['median'] / raw['median']:.2f}")
    print(f"propagation p99: publisher {pub['p99']} ms vs raw grant+put {raw2['p99']} ms "
          f"(+{pub['p99'] - raw2['p99']:.2f} ms); median ratio {pub['median'] / raw2['median']:.2f}")
    print(f"initial load of {big['endpoints']}: subscriber/raw get = "
          f"{big['subscriber_initial_load_ms'] / big['raw_prefix_get_ms']:.2f} (goal <= 2); "
          f"median of the per-round ratios {big['ratio_median_of_rounds']:.2f}")
    print(f"{many['publishers']} publishers: {many['tcp_connections_to_etcd']} connection(s), "
          f"{many['lease_keepalive_streams']} keepalive stream(s), "
          f"{many['cpu_us_per_publisher_per_s']} us CPU per publisher per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
