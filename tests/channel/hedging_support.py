"""Real gRPC Echo servers whose every attempt does what the request says, for the hedging tests.

``Req(message="block,ok")``: the first attempt (no ``grpc-previous-rpc-attempts``) blocks until the client
cancels it (bounded: ``BLOCK_S``), every later one answers. Actions: ``block``, ``ok``, a status code name
(``UNAVAILABLE``: abort with it), ``pushback:N`` (abort UNAVAILABLE with ``grpc-retry-pushback-ms: N``). Each server
logs (server, attempt number, what happened) to a shared list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from harness.backends import echo_pb2, echo_pb2_grpc

BLOCK_S = 10.0  # a blocked attempt gives up after this (a test that never cancels it still ends)

HEDGE_SERVICE = "waypost.test.Echo"


class HedgeLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, int, str]] = []

    def add(self, server: str, attempt: int, what: str) -> None:
        with self.lock:
            self.events.append((server, attempt, what))

    def of(self, what: str) -> list[tuple[str, int]]:
        with self.lock:
            return [(s, n) for s, n, w in self.events if w == what]

    def first(self, timeout: float = 20.0) -> tuple[str, int]:
        """(server, 0): where the call's first attempt went, once its server logged it (bounded wait)."""
        end = time.monotonic() + timeout
        while True:
            found = [e for e in self.of("start") if e[1] == 0]
            if found or time.monotonic() > end:
                assert found, "no server logged the first attempt"
                return found[0]
            time.sleep(0.01)


class ScriptedEcho(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str, log: HedgeLog) -> None:
        self.name = name
        self.log = log

    def _act(self, request: Any, context: grpc.ServicerContext) -> int:
        attempt = 0
        for k, v in context.invocation_metadata():
            if k == "grpc-previous-rpc-attempts":
                attempt = int(v)
        actions = request.message.split(",")
        action = actions[min(attempt, len(actions) - 1)]
        self.log.add(self.name, attempt, "start")
        if action == "block":
            end = time.monotonic() + BLOCK_S
            while context.is_active() and time.monotonic() < end:
                time.sleep(0.005)
            self.log.add(self.name, attempt, "cancelled" if not context.is_active() else "unblocked")
            return attempt
        if action.startswith("pushback:"):
            context.set_trailing_metadata((("grpc-retry-pushback-ms", action.partition(":")[2]),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "pushback")
        if action != "ok":
            context.abort(grpc.StatusCode[action], f"scripted {action}")
        self.log.add(self.name, attempt, "answered")
        return attempt

    def Unary(self, request, context):
        n = self._act(request, context)
        return echo_pb2.EchoReply(message=request.message, server=self.name, previous_attempts=str(n))

    def ServerStream(self, request, context):
        n = self._act(request, context)
        for i in range(2):
            yield echo_pb2.EchoReply(message=request.message, server=self.name, index=i, previous_attempts=str(n))


@contextmanager
def scripted_servers(*names: str) -> Iterator[tuple[list[str], HedgeLog]]:
    """In-process scripted servers on free loopback ports: (addresses, log)."""
    log = HedgeLog()
    servers, addresses = [], []
    try:
        for name in names:
            s = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
            echo_pb2_grpc.add_EchoServicer_to_server(ScriptedEcho(name, log), s)
            port = s.add_insecure_port("127.0.0.1:0")
            s.start()
            servers.append(s)
            addresses.append(f"127.0.0.1:{port}")
        yield addresses, log
    finally:
        for s in servers:
            s.stop(0).wait(10)


def hedging_config(delay: str = "0.3s", *, max_attempts: int = 3, non_fatal: tuple[str, ...] = ("UNAVAILABLE",),
                   share: float | None = -1, throttling: dict[str, float] | None = None) -> dict[str, Any]:
    """A round_robin service config hedging the Echo service. The default delay leaves a loaded machine's server
    time to start the first attempt before the hedge ends it (else that server never sees the attempt at all).
    ``share``: maxExtraShare (-1: the most there is, maxAttempts - 1, so the cap stays out of the way; None: left
    out, waypost's default)."""
    policy: dict[str, Any] = {"maxAttempts": max_attempts, "hedgingDelay": delay,
                              "nonFatalStatusCodes": list(non_fatal)}
    if share is not None:
        policy["maxExtraShare"] = max_attempts - 1 if share == -1 else share
    cfg: dict[str, Any] = {"loadBalancingConfig": [{"round_robin": {}}],
                           "methodConfig": [{"name": [{"service": HEDGE_SERVICE}], "hedgingPolicy": policy}]}
    if throttling is not None:
        cfg["retryThrottling"] = throttling
    return cfg
