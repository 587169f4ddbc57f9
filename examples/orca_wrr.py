"""ORCA load reports and gRPC's weighted_round_robin (gRFC A58), with a utilization that follows the load.

    python examples/orca_wrr.py [--rounds 6] [--fixed]

Three Greeter servers in this process, each costing a different service time per call (9, 3 and 1 ms: the
"hot", "warm" and "cool" one), report through ORCA (``waypost.serve`` mounts it; the ``xds`` extra is needed) the
work its calls of the last second cost (calls x service time, a busy fraction) as ``application_utilization``. A client dials the three
with ``weighted_round_robin`` and prints how each round of 600 calls splits.

A58 weighs a backend by ``qps / utilization``. Here utilization = qps x service time, so the weight is
1 / service time whatever the traffic: the split settles at 1/9 : 1/3 : 1/1, about 46/138/415 of 600.

``--fixed`` reports constant values instead (``set_application_utilization(0.9)``, 0.3, 0.1, as a quick test
might): utilization no longer follows the load, the weight ``qps / constant`` grows with the traffic a backend
already has, and the split runs away round after round towards the "cool" server.
"""

import argparse
import sys
import threading
import time
from collections import deque
from concurrent import futures
from pathlib import Path

import grpc
import waypost
from waypost import orca

sys.path.insert(0, str(Path(__file__).resolve().parent))
from greet_pb2 import HelloReply, HelloRequest
from greet_pb2_grpc import GreeterServicer, GreeterStub, add_GreeterServicer_to_server

#: each server's service time per call (seconds), and the constant utilization --fixed reports instead
SERVERS = {"hot": (0.009, 0.9), "warm": (0.003, 0.3), "cool": (0.001, 0.1)}
WINDOW = 1.0  # seconds of busy time a report covers


class BusyGreeter(GreeterServicer):
    """Answers after ``cost`` seconds of work and keeps how much work its calls of the last WINDOW seconds cost.

    The work is counted at its nominal cost, not timed: on a busy machine a 1 ms sleep can take several, and
    timing it would measure the machine rather than the load (a real server would count its own units of work)."""

    def __init__(self, name: str, cost: float) -> None:
        self.name, self.cost = name, cost
        self.lock = threading.Lock()
        self.done: deque[tuple[float, float]] = deque()  # (end time, seconds spent) of recent calls

    def SayHello(self, request, context):
        time.sleep(self.cost)  # stands for the work (CPU, I/O...) a call costs this server
        with self.lock:
            self.done.append((time.monotonic(), self.cost))
        return HelloReply(message=f"hello {request.name}", server=self.name)

    def utilization(self) -> float:
        """Seconds of work per second over the last WINDOW: it rises and falls with the calls taken."""
        cutoff = time.monotonic() - WINDOW
        with self.lock:
            while self.done and self.done[0][0] < cutoff:
                self.done.popleft()
            return sum(spent for _, spent in self.done) / WINDOW


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6, help="rounds of 600 calls (default 6)")
    p.add_argument("--fixed", action="store_true", help="report constant utilizations (the split runs away)")
    args = p.parse_args()

    greeters, handles = {}, []
    for name, (cost, _) in SERVERS.items():
        greeters[name] = BusyGreeter(name, cost)
        server = grpc.server(futures.ThreadPoolExecutor(8))
        add_GreeterServicer_to_server(greeters[name], server)
        handles.append(waypost.serve(server, name, listen_on="127.0.0.1:0", registry=None))
    recorders = {name: orca.server_recorder(h) for name, h in zip(SERVERS, handles)}
    stop = threading.Event()

    def report() -> None:  # what each server tells its clients, refreshed 10 times a second
        while not stop.wait(0.1):
            for name, rec in recorders.items():
                rec.set_application_utilization(SERVERS[name][1] if args.fixed else greeters[name].utilization())

    threading.Thread(target=report, daemon=True).start()
    config = {"loadBalancingConfig": [{"weighted_round_robin": {"blackoutPeriod": "0.5s",
                                                                "weightUpdatePeriod": "0.1s"}}]}
    channel = waypost.dial("direct:///" + ",".join(h.address for h in handles), service_config=config)
    stub = GreeterStub(channel)
    try:
        for r in range(1, args.rounds + 1):
            counts = dict.fromkeys(SERVERS, 0)
            for i in range(600):
                counts[stub.SayHello(HelloRequest(name=str(i)), timeout=10, wait_for_ready=True).server] += 1
            print(f"round {r}: " + " ".join(f"{name} {n}" for name, n in counts.items()), flush=True)
    finally:
        stop.set()
        channel.close()
        for h in handles:
            h.stop(0)


if __name__ == "__main__":
    main()
