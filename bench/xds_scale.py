#!/usr/bin/env python3
"""waypost's xDS control plane at fleet scale, side by side with Envoy's go-control-plane in one run.

Both control planes serve the same resources (per service a Listener, a RouteConfiguration, an EDS Cluster and
a ClusterLoadAssignment): ``waypost xds serve`` following a real local etcd, and go-control-plane v0.14.0
(``bench/xds_scale/cmd/gcp-server``: a SnapshotCache with one snapshot shared by every node, a version per
type so an endpoint change answers only EDS watches). The load is ``bench/xds_scale/cmd/ads-load``: S xDS
clients in one Go process, each with its own connection and node, subscribing LDS -> RDS -> CDS -> EDS and
ACKing every response, all started at once.

Per case (S streams over M services of N endpoints each), for each control plane, fresh:

- **connect all**: from the storm's start until every client holds its first assignment, and the failed
  attempts (a stream that ended before its configuration; the client retries as gRPC's does);
- **push**: ``--changes`` times, one endpoint is added to (or removed from) service 0 -- an etcd write for
  waypost, a new snapshot for go-control-plane -- and the time from the change to each of svc-0's clients
  getting the new assignment (p50, p99, max over the clients; the p99 and max of the changes are reported);
- **CPU per change per stream**: the control plane's CPU time (``/proc``) over a change and the ACKs after it,
  divided by the streams it had to reach; **RSS per stream**: its RSS growth over the connect, per stream.

Cases: ``--streams`` (default 100,1000,3000,10000) with one service of 10 endpoints; ``--many`` (1,000 streams
over 50 services: a change reaches svc-0's 20 clients, ``others`` counts the responses to other clients); and
``--big`` (one 1,000-endpoint service, 10 streams: one endpoint more). With one service, a third rival,
``floor`` (``bench/xds_scale/floor_server.py``), is ADS on grpc.aio with no control plane in it: one write and
one read per stream per change, the least any Python ADS server on grpc.aio does; with ``--floor-gc``, also
``floor-gc``: the same with the collector's young threshold scaled with the streams as waypost's server does
(``waypost.xds.gc_scale``), the floor for like settings.

The Go programs are built once into ``~/.cache/waypost-servers`` (``harness.go_module``). The last lines are
the ratios (waypost / go-control-plane: below 1 is waypost ahead); JSON: bench/results/xds_scale.json.

``--native`` adds two rivals: ``native`` (``bench/xds_scale/native_server.py``), the Rust engine of
``native/xds-engine`` serving the streams, fed waypost's own resources from memory as gcp-server is; and
``waypost-native``, ``waypost xds serve --engine native`` following etcd like ``waypost`` (the engine is built
with cargo into a cache on first use).

``--rounds R`` runs each case R times (the rivals in a rotating order, each fresh), and the last lines give, per
case, each rival's spread over the rounds and waypost's ratios to the others within a round (min-max).

Usage: python bench/xds_scale.py [--streams 100,1000] [--changes 5] [--only waypost,gcp] [--workers 1,2]
       [--rounds 3] [--floor-gc] [--native]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from harness import native_engine
from harness.xds_scale_programs import XDS_SCALE_PROGRAMS
from waypost import _loop
from waypost.discovery.connections import connect
from waypost.etcd.local import LocalEtcd

PROGRAMS = XDS_SCALE_PROGRAMS
#: file descriptors each process may open: a stream is a connection on each side
NOFILE = 65536
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, NOFILE), max(hard, NOFILE)))
    except (ValueError, OSError):  # not root: as high as the hard limit allows
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Proc:
    """A child process speaking JSON lines: ``send(line)``, ``read(timeout)`` (non-JSON lines are kept as raw)."""

    def __init__(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        fd, log = tempfile.mkstemp(prefix=f"xds-scale-{name}-", suffix=".log")
        self.log_path = log
        # children inherit the raised RLIMIT_NOFILE of this process (main)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd,
                                     text=True, env={**os.environ, **(env or {})})
        os.close(fd)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"raw": line.strip()})

    def send(self, line: str) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float, want: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise TimeoutError(f"{self.name}: no {want or 'line'} within {timeout} s (log {self.log_path})") from None
            if want is None or want in item or ("raw" in item and want in item["raw"]):
                return item

    def pids(self) -> list[int]:
        """This process and its children (the workers of ``--workers``)."""
        pid = self.proc.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        return [pid, *map(int, children)]

    def cpu_seconds(self) -> float:
        total = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / CLK_TCK

    def rss_kib(self) -> int:
        total = 0
        for pid in self.pids():
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)


def _address(svc: int, j: int) -> str:
    return f"10.{svc % 250}.{j // 250}.{j % 250 + 1}:8080"


class WaypostPlane:
    """``waypost xds serve`` exporting svc-0..svc-(M-1), each a key of the local etcd holding N endpoints."""

    name = "waypost"

    def __init__(self, etcd: LocalEtcd, services: int, endpoints: int, workers: int,
                 native_dir: Path | None = None) -> None:
        self.reg = connect(etcd.url())
        self.prefix = f"xscale{time.monotonic_ns() % 10**9}"
        self.endpoints = endpoints
        self.added: dict[int, bool] = {}
        for svc in range(services):
            for j in range(endpoints):
                _loop.run(self.reg.put(f"{self.prefix}-svc-{svc}/{j}", _address(svc, j).encode()), 10)
        argv = [sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0"]
        if workers > 1:
            argv += ["--workers", str(workers)]
        if native_dir:
            argv += ["--engine", "native"]
        for svc in range(services):
            argv += ["--export", f"svc-{svc}=etcd:///{etcd.endpoint}?key={self.prefix}-svc-{svc}"]
        paths = [str(native_dir)] if native_dir else []
        env = {"PYTHONPATH": os.pathsep.join([*paths, str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        self.proc = Proc(argv, "waypost", env)
        line = self.proc.read(120, "xds: serving on")["raw"]
        self.address = line.split("xds: serving on", 1)[1].strip()

    def change(self, svc: int) -> None:
        key = f"{self.prefix}-svc-{svc}/{self.endpoints}"
        if self.added.get(svc):
            _loop.run(self.reg.delete(key), 10)
        else:
            _loop.run(self.reg.put(key, _address(svc, self.endpoints).encode()), 10)
        self.added[svc] = not self.added.get(svc)

    def close(self) -> None:
        self.proc.stop()
        _loop.run(self.reg.delete(self.prefix, prefix=True), 10)
        _loop.run(self.reg.close(), 10)


class GoControlPlane:
    name = "go-control-plane"

    def __init__(self, binary: Path, services: int, endpoints: int) -> None:
        self.proc = Proc([str(binary), "-listen", "127.0.0.1:0", "-services", str(services),
                          "-endpoints", str(endpoints)], "gcp")
        self.address = self.proc.read(60, "listening")["listening"]

    def change(self, svc: int) -> None:
        self.proc.send(f"change {svc}")
        self.proc.read(30, "changed")

    def close(self) -> None:
        self.proc.stop()


class NativePlane:
    """``bench/xds_scale/native_server.py``: the native engine (native/xds-engine) serving, Python building."""

    name = "native"

    def __init__(self, module_dir: Path, services: int, endpoints: int) -> None:
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        self.proc = Proc([sys.executable, str(ROOT / "bench" / "xds_scale" / "native_server.py"), str(module_dir),
                          "--services", str(services), "--endpoints", str(endpoints)], "native", env)
        self.address = self.proc.read(60, "listening")["listening"]

    def change(self, svc: int) -> None:
        self.proc.send(f"change {svc}")
        self.proc.read(30, "changed")

    def close(self) -> None:
        self.proc.stop()


class FloorPlane:
    """``bench/xds_scale/floor_server.py``: ADS on grpc.aio with nothing else (one service only)."""

    def __init__(self, scale_gc: bool = False) -> None:
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, str(ROOT / "bench" / "xds_scale" / "floor_server.py")] + (["--gc-scale"] if scale_gc else [])
        self.proc = Proc(argv, "floor", env)
        self.address = self.proc.read(60, "listening")["listening"]

    def change(self, svc: int) -> None:
        self.proc.send(f"change {svc}")
        self.proc.read(30, "changed")

    def close(self) -> None:
        self.proc.stop()


def run_case(plane: Any, load_bin: Path, streams: int, services: int, changes: int,
             connect_timeout: float) -> dict[str, Any]:
    """One fleet against one control plane (module docstring)."""
    time.sleep(0.5)  # the plane's start-up work is done before the storm
    rss0 = plane.proc.rss_kib()
    load = Proc([str(load_bin), "-server", plane.address, "-streams", str(streams), "-services", str(services),
                 "-connect-timeout", f"{connect_timeout}s", "-push-timeout", "60s"], "ads-load")
    try:
        conn = load.read(connect_timeout + 30, "connected")
        time.sleep(1.0)  # ACKs of the last responses in
        rss1 = plane.proc.rss_kib()
        pushes = []
        cpu = 0.0  # summed over the changes: /proc counts in clock ticks (10 ms), too coarse for one
        reached = 0
        for _ in range(changes):
            time.sleep(0.3)
            cpu0 = plane.proc.cpu_seconds()
            load.send("mark 0")
            marked = load.read(10, "marked")
            plane.change(0)
            pushes.append(load.read(90, "push"))
            time.sleep(0.2)  # the ACKs answering the push count to its cost
            cpu += plane.proc.cpu_seconds() - cpu0
            reached += marked["expect"]
    finally:
        load.stop()
    complete = [p for p in pushes if p["got"] == p["expect"]]
    return {
        "streams": streams, "services": services,
        "connected": conn["connected"], "connect_s": round(conn["seconds"], 3),
        "connect_p99_ms": conn["p99_ms"], "failed_attempts": conn["failed_attempts"], "codes": conn["codes"],
        "rss_kib_per_stream": round((rss1 - rss0) / max(streams, 1), 1),
        "push_p99_ms": max((p["p99_ms"] for p in complete), default=None),
        "push_max_ms": max((p["max_ms"] for p in complete), default=None),
        "push_p50_ms": statistics.median(p["p50_ms"] for p in complete) if complete else None,
        "incomplete_pushes": len(pushes) - len(complete),
        "other_responses": sum(p["others"] for p in pushes),
        "cpu_us_per_change_per_stream": round(cpu * 1e6 / reached, 1) if reached else None,
        "pushes": pushes,
    }


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "n/a"


def _summary(results: list[dict[str, Any]]) -> None:
    """Per case, over its rounds: each rival's CPU per change per stream and push p99 (min-max; the p99 of a round
    is its worst change's, as on the lines above, and the median change's is given too: one change delayed by
    another process on a shared machine moves the first, not the second), and waypost's ratios to the floor(s)
    and to go-control-plane, taken within a round."""
    by_case: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for row in results:
        by_case.setdefault((row["streams"], row["services"], row["endpoints"]), []).append(row)
    print()
    for (streams, services, endpoints), rows in by_case.items():
        head = f"S={streams} M={services} N={endpoints} ({len(rows)} round(s))"
        rivals = sorted({k for row in rows for k, v in row.items() if isinstance(v, dict)})
        for name in rivals:
            runs = [row[name] for row in rows if name in row]
            cpu = [r["cpu_us_per_change_per_stream"] for r in runs if r["cpu_us_per_change_per_stream"] is not None]
            p99 = [r["push_p99_ms"] for r in runs if r["push_p99_ms"] is not None]
            typical = [statistics.median(p["p99_ms"] for p in r["pushes"]) for r in runs if r["pushes"]]
            print(f"summary {head} {name:10} cpu {_spread(cpu)} us/change/stream, push p99 {_spread(p99)} ms "
                  f"(the median change's p99: {_spread(typical)} ms)")
        for name in (n for n in rivals if n.startswith("waypost")):
            for base in (n for n in rivals if not n.startswith("waypost")):
                pairs = [(row[name], row[base]) for row in rows if name in row and base in row]
                cpu = [a["cpu_us_per_change_per_stream"] / b["cpu_us_per_change_per_stream"] for a, b in pairs
                       if a["cpu_us_per_change_per_stream"] and b["cpu_us_per_change_per_stream"]]
                p99 = [a["push_p99_ms"] / b["push_p99_ms"] for a, b in pairs if a["push_p99_ms"] and b["push_p99_ms"]]
                print(f"summary {head} {name} / {base}: cpu {_spread(cpu)}x, push p99 {_spread(p99)}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="100,1000,3000,10000", help="fleet sizes (comma list)")
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--changes", type=int, default=5)
    ap.add_argument("--many", type=int, default=1000, help="streams of the 50-service case (0: skip)")
    ap.add_argument("--big", type=int, default=1000, help="endpoints of the big-service case (0: skip)")
    ap.add_argument("--only", default=None,
                    help="run only these rivals (comma list of name prefixes: gcp, waypost, floor, native)")
    ap.add_argument("--workers", default="1,2", help="waypost xds serve --workers values, each a rival (comma list)")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also run grpc.aio's floor (floor_server.py: ADS with no control plane in it)")
    ap.add_argument("--native", action=argparse.BooleanOptionalAction, default=False,
                    help="also run the native engine (native/xds-engine; built with cargo, cached)")
    ap.add_argument("--floor-gc", action="store_true",
                    help="also run the floor with waypost's collector scaling (floor_server.py --gc-scale)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each case, each rival fresh in each (the summary gives the spread)")
    ap.add_argument("--connect-timeout", type=float, default=120.0)
    ap.add_argument("--build-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "xds_scale.json"))
    args = ap.parse_args()
    _raise_nofile()
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    bins = PROGRAMS.build(args.build_timeout)
    native_dir = native_engine.build(args.build_timeout) if args.native else None
    cases = [(int(s), 1, args.endpoints) for s in args.streams.split(",") if s.strip()]
    if args.many:
        cases.append((args.many, 50, args.endpoints))
    if args.big:
        cases.append((10, 1, args.big))
    only = [o.strip() for o in args.only.split(",")] if args.only else None
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="waypost-bench-") as tmp, LocalEtcd(1, base_dir=Path(tmp)) as etcd:
        for streams, services, endpoints in cases:
            planes = [("gcp", 0)] + [(f"waypost-{w}w" if w > 1 else "waypost", w) for w in worker_counts]
            if args.floor and services == 1 and endpoints == args.endpoints:
                planes.append(("floor", 0))
            if args.floor_gc and services == 1 and endpoints == args.endpoints:
                planes.append(("floor-gc", 0))
            if native_dir:
                planes += [("native", 0), ("waypost-native", 1)]
            planes = [p for p in planes if not only or p[0].startswith(tuple(only))]
            for rnd in range(args.rounds):
                row: dict[str, Any] = {"streams": streams, "services": services, "endpoints": endpoints,
                                       "round": rnd, "load": os.getloadavg()[0]}
                # each round starts with the next rival, so none always runs first (or last) on a shared machine
                for which, workers in planes[rnd % len(planes):] + planes[:rnd % len(planes)]:
                    plane: Any = (GoControlPlane(bins["gcp-server"], services, endpoints) if which == "gcp"
                                  else FloorPlane(which == "floor-gc") if which.startswith("floor")
                                  else NativePlane(native_dir, services, endpoints) if which == "native" and native_dir
                                  else WaypostPlane(etcd, services, endpoints, workers,
                                                    native_dir if which == "waypost-native" else None))
                    try:
                        row[which] = run_case(plane, bins["ads-load"], streams, services, args.changes,
                                              args.connect_timeout)
                    finally:
                        plane.close()
                    r = row[which]
                    print(f"{which:12} S={streams:<6} M={services:<3} N={endpoints:<5} connect {r['connect_s']:.2f} s "
                          f"({r['connected']}/{streams}, {r['failed_attempts']} failed attempts), push p99 "
                          f"{r['push_p99_ms']} ms max {r['push_max_ms']} ms, cpu {r['cpu_us_per_change_per_stream']} "
                          f"us/change/stream, rss {r['rss_kib_per_stream']} KiB/stream, others "
                          f"{r['other_responses']} (load {os.getloadavg()[0]:.1f})", flush=True)
                results.append(row)
    print()
    for row in results:
        gcp = row.get("gcp")
        for name, wp in row.items():
            if not (isinstance(wp, dict) and name.startswith(("waypost", "floor", "native")) and gcp):
                continue
            print(f"ratio {name} S={row['streams']} M={row['services']} N={row['endpoints']}: connect all "
                  f"{_ratio(wp['connect_s'], gcp['connect_s'])}, push p99 "
                  f"{_ratio(wp['push_p99_ms'], gcp['push_p99_ms'])}, cpu/change/stream "
                  f"{_ratio(wp['cpu_us_per_change_per_stream'], gcp['cpu_us_per_change_per_stream'])}, rss/stream "
                  f"{_ratio(wp['rss_kib_per_stream'], gcp['rss_kib_per_stream'])} (/ go-control-plane)")
    _summary(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": results, "argv": sys.argv[1:], "cpus": os.cpu_count()}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
