"""Benchmark: waypost's etcd client beside raw generated-message calls on a plain grpc.aio channel.

Measures, against a local etcd started here (LocalEtcd), in one run and on the same event loop:
  - put latency,
  - prefix get of 1,000 keys (waypost Registry, the same with every KeyValue built -- the Registry's
    result converts on first element access --, waypost EtcdClient, raw),
  - the same get followed by reading every field of every record, on both sides: waypost reads its
    KeyValues, raw reads the protobuf messages and decodes the key to str as KeyValue.key is
    (get_wp_read_all / get_raw_read_all: the like-for-like ratio for a caller that reads them all),
  - put -> watch event latency (median and p99).
Rounds of waypost and raw alternate so machine noise hits both alike. Prints a table, then the
ratios (waypost / raw, lower is better; goal <= 1.2), ending with the two get ratios (lazy, read
all), and writes bench/results/etcd_client.json.

    python bench/etcd_client.py [--puts 2000] [--gets 200] [--watch 1000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from waypost import _loop
from waypost.etcd import _methods
from waypost.etcd._generated import waypost_etcd_pb2 as pb
from waypost.etcd.config import EtcdConfig
from waypost.etcd.local import LocalEtcd
from waypost.registries.etcd.store import EtcdRegistry

RESULTS = Path(__file__).resolve().parent / "results" / "etcd_client.json"


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "median_us": statistics.median(samples) * 1e6, "p99_us": pct(samples, 0.99) * 1e6,
            "mean_us": statistics.fmean(samples) * 1e6}


class Raw:
    """Plain grpc.aio calls with our generated messages: the floor waypost is compared with."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.put = self.channel.unary_unary(_methods.PUT, request_serializer=pb.PutRequest.SerializeToString,
                                            response_deserializer=pb.PutResponse.FromString)
        self.range = self.channel.unary_unary(_methods.RANGE, request_serializer=pb.RangeRequest.SerializeToString,
                                              response_deserializer=pb.RangeResponse.FromString)
        self.watch = self.channel.stream_stream(_methods.WATCH,
                                                request_serializer=pb.WatchRequest.SerializeToString,
                                                response_deserializer=pb.WatchResponse.FromString)


async def bench_put(reg: EtcdRegistry, raw: Raw, n: int) -> tuple[list[float], list[float]]:
    w: list[float] = []
    r: list[float] = []
    for i in range(n):
        key = f"bench/put/{i % 100}"
        t0 = time.perf_counter()
        await reg.put(key, b"v")
        w.append(time.perf_counter() - t0)
        req = pb.PutRequest(key=key.encode(), value=b"v")
        t0 = time.perf_counter()
        await raw.put(req, timeout=5)
        r.append(time.perf_counter() - t0)
    return w, r


def read_keyvalues(kvs: Any) -> tuple[int, str]:
    """What a caller that reads a whole result does with waypost: every field of every KeyValue."""
    n = 0
    key = ""
    for kv in kvs:
        key = kv.key
        value = kv.value
        create_revision = kv.create_revision
        mod_revision = kv.mod_revision
        version = kv.version
        lease = kv.lease
        n += 1
    del value, create_revision, mod_revision, version, lease
    return n, key


def read_messages(kvs: Any) -> tuple[int, str]:
    """The same reads on raw protobuf messages, the key decoded to str as KeyValue.key is."""
    n = 0
    key = ""
    for m in kvs:
        key = m.key.decode()
        value = m.value
        create_revision = m.create_revision
        mod_revision = m.mod_revision
        version = m.version
        lease = m.lease
        n += 1
    del value, create_revision, mod_revision, version, lease
    return n, key


async def bench_get(reg: EtcdRegistry, raw: Raw, n: int) -> dict[str, list[float]]:
    """Each case gets the 1,000 keys; a result is dropped before the next case starts, so no case
    pays for freeing another's objects. The two read-all cases also drop their result inside the
    timing (a caller pays for freeing what it read) and swap order every round."""
    client = reg.client
    req = pb.RangeRequest(key=b"bench/keys/", range_end=b"bench/keys0")
    last = (1000, "bench/keys/0999")

    async def lazy() -> float:
        t0 = time.perf_counter()
        got = await reg.get("bench/keys/", prefix=True)
        dt = time.perf_counter() - t0
        assert len(got.kvs) == 1000
        return dt

    async def all_kvs() -> float:  # every KeyValue built (GetResult.kvs converts on first element access)
        t0 = time.perf_counter()
        got = await reg.get("bench/keys/", prefix=True)
        kvs = list(got.kvs)
        dt = time.perf_counter() - t0
        assert len(kvs) == 1000 and kvs[0].key == "bench/keys/0000"
        return dt

    async def via_client() -> float:
        t0 = time.perf_counter()
        resp = await client.range(b"bench/keys/", b"bench/keys0")
        dt = time.perf_counter() - t0
        assert len(resp.kvs) == 1000
        return dt

    async def via_raw() -> float:
        t0 = time.perf_counter()
        resp = await raw.range(req, timeout=5)
        dt = time.perf_counter() - t0
        assert len(resp.kvs) == 1000
        return dt

    async def read_all_waypost() -> float:
        t0 = time.perf_counter()
        got = await reg.get("bench/keys/", prefix=True)
        seen = read_keyvalues(got.kvs)
        del got
        dt = time.perf_counter() - t0
        assert seen == last
        return dt

    async def read_all_raw() -> float:
        t0 = time.perf_counter()
        resp = await raw.range(req, timeout=5)
        seen = read_messages(resp.kvs)
        del resp
        dt = time.perf_counter() - t0
        assert seen == last
        return dt

    out: dict[str, list[float]] = {k: [] for k in ("get_waypost", "get_wp_all_kvs", "get_client", "get_raw",
                                                   "get_wp_read_all", "get_raw_read_all")}
    for i in range(n):
        out["get_waypost"].append(await lazy())
        out["get_wp_all_kvs"].append(await all_kvs())
        out["get_client"].append(await via_client())
        out["get_raw"].append(await via_raw())
        pair = [("get_wp_read_all", read_all_waypost), ("get_raw_read_all", read_all_raw)]
        for name, case in pair if i % 2 == 0 else pair[::-1]:
            out[name].append(await case())
    return out


async def bench_watch(reg: EtcdRegistry, raw: Raw, n: int) -> tuple[list[float], list[float]]:
    """put (raw, same for both) -> event seen by a waypost watcher / by a raw watch stream."""
    watcher = reg.watch("bench/w1/", prefix=True)
    it = watcher.__aiter__()
    stream = raw.watch()
    await stream.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
        key=b"bench/w2/", range_end=b"bench/w20")))
    created = await stream.read()
    assert created.created
    await asyncio.sleep(0.2)
    w: list[float] = []
    r: list[float] = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            await raw.put(pb.PutRequest(key=f"bench/w1/{i % 10}".encode(), value=b"x"), timeout=5)
            await asyncio.wait_for(it.__anext__(), 5)
            w.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await raw.put(pb.PutRequest(key=f"bench/w2/{i % 10}".encode(), value=b"x"), timeout=5)
            while True:
                resp = await asyncio.wait_for(stream.read(), 5)
                if resp.events:
                    break
            r.append(time.perf_counter() - t0)
    finally:
        watcher.cancel()
        stream.cancel()
    return w, r


async def main_async(args: argparse.Namespace, endpoint: str) -> dict[str, Any]:
    reg = EtcdRegistry(EtcdConfig(endpoints=(endpoint,)))
    raw = Raw(endpoint)
    try:
        # preload and warm up both paths
        for i in range(1000):
            await raw.put(pb.PutRequest(key=f"bench/keys/{i:04d}".encode(), value=b"10.0.0.1:8080"), timeout=5)
        await bench_put(reg, raw, 50)
        await bench_get(reg, raw, 5)
        res: dict[str, list[float]] = {k: [] for k in
                                       ("put_waypost", "put_raw", "get_waypost", "get_wp_all_kvs",
                                        "get_client", "get_raw", "get_wp_read_all", "get_raw_read_all",
                                        "watch_waypost", "watch_raw")}
        for _ in range(args.rounds):
            a, b = await bench_put(reg, raw, args.puts // args.rounds)
            res["put_waypost"] += a
            res["put_raw"] += b
            for k, v in (await bench_get(reg, raw, args.gets // args.rounds)).items():
                res[k] += v
            a, b = await bench_watch(reg, raw, args.watch // args.rounds)
            res["watch_waypost"] += a
            res["watch_raw"] += b
        return {k: summary(v) for k, v in res.items()}
    finally:
        await reg.close()
        await raw.channel.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--gets", type=int, default=200)
    ap.add_argument("--watch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with LocalEtcd(1) as etcd:
        stats = _loop.run(main_async(args, etcd.endpoint), 600)
    ratios = {
        "put_median": stats["put_waypost"]["median_us"] / stats["put_raw"]["median_us"],
        "get1000_median": stats["get_waypost"]["median_us"] / stats["get_raw"]["median_us"],
        "get1000_client_median": stats["get_client"]["median_us"] / stats["get_raw"]["median_us"],
        "get1000_all_kvs_median": stats["get_wp_all_kvs"]["median_us"] / stats["get_raw"]["median_us"],
        "watch_median": stats["watch_waypost"]["median_us"] / stats["watch_raw"]["median_us"],
        "watch_p99": stats["watch_waypost"]["p99_us"] / stats["watch_raw"]["p99_us"],
        "get1000_read_all_median": stats["get_wp_read_all"]["median_us"] / stats["get_raw_read_all"]["median_us"],
    }
    out = {
        "benchmark": "etcd_client",
        "python": platform.python_version(), "grpcio": grpc.__version__, "machine": platform.machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": round(time.monotonic() - t0, 1),
        "stats": stats, "ratios_waypost_over_raw": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'case':<18}{'n':>7}{'median us':>12}{'p99 us':>12}")
    for k, v in stats.items():
        print(f"{k:<18}{v['n']:>7}{v['median_us']:>12.0f}{v['p99_us']:>12.0f}")
    print(f"wrote {args.out}")
    print("ratios (waypost / raw, lower is better):")
    for k, v in ratios.items():
        print(f"  {k:<24}{v:6.2f}x")
    print(f"get 1,000 keys, KeyValues built lazily (get1000_median):            {ratios['get1000_median']:.2f}x")
    print(f"get 1,000 keys + read every field (get1000_read_all_median):     {ratios['get1000_read_all_median']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
