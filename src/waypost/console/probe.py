"""The console's own ``grpc.health.v1`` probe of every instance on screen: bounded and cached.

Every ``INTERVAL`` seconds each address on the board is asked ``Check(service="")`` with a deadline of
``TIMEOUT`` seconds, at most ``CONCURRENCY`` at a time and ``MAX_ADDRESSES`` per round; the answer is kept until
the next round (so every browser sees the same cached status, and a page load probes nothing). One channel per
address, closed when the address leaves the board.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .board import Board, Health

log = logging.getLogger("waypost.console")

INTERVAL = 3.0
TIMEOUT = 1.0
CONCURRENCY = 32
MAX_ADDRESSES = 1000


class HealthProber:
    def __init__(self, board: Board, *, interval: float = INTERVAL, timeout: float = TIMEOUT) -> None:
        self.board = board
        self.interval = interval
        self.timeout = timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._task: asyncio.Task[None] | None = None
        self._sem = asyncio.Semaphore(CONCURRENCY)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="waypost-console-health")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for ch in self._channels.values():
            await ch.close(None)
        self._channels.clear()

    async def _run(self) -> None:
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # the next round tries again
                log.exception("console: health round failed")
            await asyncio.sleep(self.interval)

    async def round(self) -> None:
        addresses = sorted(self.board.addresses())[:MAX_ADDRESSES]
        for gone in set(self._channels) - set(addresses):
            await self._channels.pop(gone).close(None)
            self.board.health.pop(gone, None)
        if not addresses:
            return
        results = await asyncio.gather(*(self._check(a) for a in addresses))
        changed = False
        for address, health in zip(addresses, results, strict=True):
            old = self.board.health.get(address)
            self.board.health[address] = health
            changed = changed or old is None or (old.status, old.detail) != (health.status, health.detail)
        if changed:
            self.board.touch()

    async def _check(self, address: str) -> Health:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(
                address, options=[("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", 500),
                                  ("grpc.max_reconnect_backoff_ms", 2000)])
        async with self._sem:
            try:
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                                   timeout=self.timeout)
            except grpc.aio.AioRpcError as e:
                code = e.code()
                status = {grpc.StatusCode.UNIMPLEMENTED: "NO_HEALTH_SERVICE",
                          grpc.StatusCode.NOT_FOUND: "SERVICE_UNKNOWN",
                          grpc.StatusCode.UNAVAILABLE: "UNREACHABLE",
                          grpc.StatusCode.DEADLINE_EXCEEDED: "TIMEOUT"}.get(code, code.name)
                return Health(status, time.time(), (e.details() or "")[:200])
            return Health(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), time.time())
