"""What load accounting costs a server: throughput and CPU per call, with and without, side by side.

Two Echo servers run as subprocesses of this script (``--serve``), identical except that one has the
load-report service and its accounting interceptor mounted (``waypost.loadreport.mount``, what
``waypost.serve`` does). The client (this process, ``--callers`` threads in a closed loop, replies
without delay) loads them in alternating rounds (plain, accounted, plain, ...) so that both see the
same machine; each round measures calls per second and the server process's CPU time per call (from
/proc, so the client's own cost does not dilute the figure).

The machine's noise (other processes) easily exceeds the 2 % being looked for, so the interceptor's
own cost is also timed in-process, without the network: ``intercept_service`` plus the wrapped
behaviour against the bare behaviour, a million-call loop each, best of 5. That difference over the
plain server's CPU per call is the third figure, the one least sensitive to a busy machine.

Prints one line per round pair and, last: ``load cost: throughput accounted/plain = <r>`` (median
over pairs; goal >= 0.98), ``load cost: server cpu per call accounted/plain = <r>`` and
``load cost: interceptor <us> us per call = <pct>% of the plain server's CPU per call``.
JSON to bench/results/server_load_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import grpc

from tests.backends import echo_pb2, echo_pb2_grpc
from tests.backends.server import EchoServicer

REQ = echo_pb2.EchoRequest(message="x")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def serve_main(accounted: bool, workers: int) -> int:
    """Child process: one Echo server, printing ``PORT <n>``; exits when stdin closes."""
    server = grpc.server(futures.ThreadPoolExecutor(workers))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("accounted" if accounted else "plain"), server)
    if accounted:
        from waypost.loadreport import mount

        mount(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin (or dies)
    server.stop(0).wait(5)
    return 0


class Child:
    def __init__(self, accounted: bool, workers: int) -> None:
        cmd = [sys.executable, __file__, "--serve", "accounted" if accounted else "plain", "--workers", str(workers)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"server did not start: {line!r}")
        self.address = f"127.0.0.1:{int(line.split()[1])}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def load_round(stub: echo_pb2_grpc.EchoStub, callers: int, seconds: float) -> int:
    counts = [0] * callers
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        n = 0
        while time.perf_counter() < stop and n < 10_000_000:
            stub.Unary(REQ, timeout=30)
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts)


def interceptor_cost_us(calls: int = 200_000, repeat: int = 5) -> dict[str, float]:
    """Per-call time of the accounting path alone (in-process, no network): wrapped minus bare."""
    from waypost.loadreport import LoadInterceptor

    def behavior(request: object, context: object) -> object:
        return request

    handler = grpc.unary_unary_rpc_method_handler(behavior)
    details = type("Details", (), {"method": "/waypost.test.Echo/Unary", "invocation_metadata": ()})()
    interceptor = LoadInterceptor()

    def continuation(_details: object) -> grpc.RpcMethodHandler:
        return handler

    def bare() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            continuation(details).unary_unary(REQ, None)
        return time.perf_counter() - t0

    def accounted() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            interceptor.intercept_service(continuation, details).unary_unary(REQ, None)
        return time.perf_counter() - t0

    b = min(bare() for _ in range(repeat)) / calls * 1e6
    a = min(accounted() for _ in range(repeat)) / calls * 1e6
    return {"bare_us": b, "accounted_us": a, "overhead_us": a - b}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="round pairs (plain + accounted)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per round")
    ap.add_argument("--workers", type=int, default=8, help="server thread pool size")
    ap.add_argument("--out", default=str(ROOT / "bench/results/server_load_cost.json"))
    ap.add_argument("--serve", choices=["plain", "accounted"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve_main(args.serve == "accounted", args.workers)

    children = {"plain": Child(False, args.workers), "accounted": Child(True, args.workers)}
    pairs: list[dict[str, dict[str, float]]] = []
    try:
        channels = {k: grpc.insecure_channel(c.address) for k, c in children.items()}
        stubs = {k: echo_pb2_grpc.EchoStub(ch) for k, ch in channels.items()}
        for stub in stubs.values():  # warm up both (connections, thread pools, first-call costs)
            load_round(stub, args.callers, 0.5)
        for r in range(args.rounds):
            pair: dict[str, dict[str, float]] = {}
            order = ("plain", "accounted") if r % 2 == 0 else ("accounted", "plain")  # cancel drift
            for k in order:
                c0, t0 = children[k].cpu_seconds(), time.perf_counter()
                calls = load_round(stubs[k], args.callers, args.seconds)
                dt, cpu = time.perf_counter() - t0, children[k].cpu_seconds() - c0
                pair[k] = {"calls": calls, "calls_per_s": calls / dt, "server_cpu_us_per_call": cpu / calls * 1e6}
            pairs.append(pair)
            print(f"round {r}: plain {pair['plain']['calls_per_s']:7.0f}/s "
                  f"{pair['plain']['server_cpu_us_per_call']:6.1f} us cpu/call   "
                  f"accounted {pair['accounted']['calls_per_s']:7.0f}/s "
                  f"{pair['accounted']['server_cpu_us_per_call']:6.1f} us cpu/call", flush=True)
        for ch in channels.values():
            ch.close()
    finally:
        for c in children.values():
            c.close()
    micro = interceptor_cost_us()
    tput = [p["accounted"]["calls_per_s"] / p["plain"]["calls_per_s"] for p in pairs]
    cpu = [p["accounted"]["server_cpu_us_per_call"] / p["plain"]["server_cpu_us_per_call"] for p in pairs]
    summary = {
        "throughput_ratio_median": statistics.median(tput),
        "throughput_ratios": tput,
        "cpu_per_call_ratio_median": statistics.median(cpu),
        "cpu_per_call_ratios": cpu,
        "interceptor": micro,
        "plain_server_cpu_us_per_call_median": statistics.median(p["plain"]["server_cpu_us_per_call"] for p in pairs),
    }
    share = micro["overhead_us"] / summary["plain_server_cpu_us_per_call_median"]
    summary["interceptor_share_of_server_cpu"] = share
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "pairs": pairs, "summary": summary}, indent=2))
    print(f"load cost: throughput accounted/plain = {summary['throughput_ratio_median']:.3f} "
          f"(pairs: {', '.join(f'{x:.3f}' for x in tput)})")
    print(f"load cost: server cpu per call accounted/plain = {summary['cpu_per_call_ratio_median']:.3f} "
          f"(pairs: {', '.join(f'{x:.3f}' for x in cpu)})")
    print(f"load cost: interceptor {micro['overhead_us']:.2f} us per call = {share * 100:.2f}% of the plain "
          f"server's CPU per call ({summary['plain_server_cpu_us_per_call_median']:.0f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
