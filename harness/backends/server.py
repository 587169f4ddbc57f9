"""The Echo test server. Every reply carries the server's name so tests see which backend answered.

Run as a subprocess: ``python -m harness.backends.server --port P --name NAME [--delay-ms D]``; it prints
``PORT <n>`` on stdout once it is serving. In-process: ``EchoServer(name).start()``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from harness.backends import echo_pb2, echo_pb2_grpc


def _previous_attempts(context: grpc.ServicerContext) -> str:
    for k, v in context.invocation_metadata():
        if k == "grpc-previous-rpc-attempts":
            return str(v)
    return ""


class EchoServicer(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str, delay_ms: int = 0, health_servicer: health.HealthServicer | None = None) -> None:
        self.name = name
        self.delay_ms = delay_ms
        self.health = health_servicer
        self.calls = 0  # approximate (test servers only)

    def _sleep(self, req: echo_pb2.EchoRequest) -> None:
        ms = req.delay_ms or self.delay_ms
        if ms:
            time.sleep(ms / 1000.0)

    def _reply(self, req: echo_pb2.EchoRequest, ctx: grpc.ServicerContext, index: int = 0, received: int = 0):
        return echo_pb2.EchoReply(message=req.message, server=self.name, index=index,
                                  previous_attempts=_previous_attempts(ctx), received=received)

    def _maybe_fail(self, req: echo_pb2.EchoRequest, ctx: grpc.ServicerContext, sent: int) -> None:
        if req.fail_on and self.name not in req.fail_on.split(","):
            return
        if req.error_code and sent >= req.error_after:
            code = next(c for c in grpc.StatusCode if c.value[0] == req.error_code)
            ctx.abort(code, req.error_details or f"requested {code.name}")

    def Unary(self, request, context):
        self.calls += 1
        self._sleep(request)
        self._maybe_fail(request, context, 0)
        return self._reply(request, context)

    def ServerStream(self, request, context):
        self.calls += 1
        for i in range(max(request.count, 1)):
            self._maybe_fail(request, context, i)
            self._sleep(request)
            yield self._reply(request, context, index=i)
        self._maybe_fail(request, context, max(request.count, 1))

    def ClientStream(self, request_iterator, context):
        self.calls += 1
        last = echo_pb2.EchoRequest()
        n = 0
        for req in request_iterator:
            last = req
            n += 1
        self._sleep(last)
        self._maybe_fail(last, context, 0)
        return self._reply(last, context, received=n)

    def BidiStream(self, request_iterator, context):
        self.calls += 1
        for i, req in enumerate(request_iterator):
            self._maybe_fail(req, context, i)
            self._sleep(req)
            yield self._reply(req, context, index=i)

    def SetHealth(self, request, context):
        if self.health is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "health service disabled")
        status = health_pb2.HealthCheckResponse.SERVING if request.serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set(request.service, status)
        return echo_pb2.EchoReply(server=self.name)


class EchoServer:
    """An in-process Echo server on 127.0.0.1 (port 0: pick a free one)."""

    def __init__(self, name: str, port: int = 0, delay_ms: int = 0, with_health: bool = True,
                 max_workers: int = 32, bind_host: str = "127.0.0.1") -> None:
        self.name = name
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                                  options=[("grpc.so_reuseport", 0)])
        # non-blocking, as waypost's serve() uses: a blocking servicer holds a server thread per Watch stream, and
        # health-checking clients (one stream per backend each, more around forks) then starve unary calls of threads
        self.health = health.HealthServicer(experimental_non_blocking=True) if with_health else None
        self.servicer = EchoServicer(name, delay_ms, self.health)
        echo_pb2_grpc.add_EchoServicer_to_server(self.servicer, self.server)
        if self.health is not None:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.host = bind_host
        self.port = self.server.add_insecure_port(f"{bind_host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"could not bind {bind_host}:{port}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> EchoServer:
        self.server.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        self.server.stop(grace).wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--name", required=True)
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--no-health", action="store_true", help="do not register grpc.health.v1")
    ap.add_argument("--workers", type=int, default=32)
    args = ap.parse_args(argv)
    srv = EchoServer(args.name, args.port, args.delay_ms, with_health=not args.no_health,
                     max_workers=args.workers).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sys.stdout.write(f"PORT {srv.port}\n")
    sys.stdout.flush()
    stop.wait()
    srv.stop(1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
