"""grpc.health.v1 Watch for one backend, as a coroutine (no thread per backend).

NOT_SERVING / SERVICE_UNKNOWN -> unhealthy; SERVING -> healthy; UNIMPLEMENTED -> healthy (the server has
no health service, as gRPC's client-side health checking treats it); a broken stream -> unknown until
the next answer (connectivity tracking covers dead connections), retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2

log = logging.getLogger("waypost.client.health")

WATCH_METHOD = "/grpc.health.v1.Health/Watch"


async def watch_health(
    channel: grpc.aio.Channel,
    service: str,
    report: Callable[[bool | None, str], None],
    *,
    min_backoff: float = 0.1,
    max_backoff: float = 2.0,
) -> None:
    """Run until cancelled, calling ``report(healthy, note)`` on every change."""
    watch = channel.unary_stream(
        WATCH_METHOD,
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    backoff = min_backoff
    serving = health_pb2.HealthCheckResponse.SERVING
    while True:
        call = watch(health_pb2.HealthCheckRequest(service=service), wait_for_ready=True)
        try:
            async for resp in call:
                backoff = min_backoff
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                report(resp.status == serving, name)
            report(None, "health stream ended")
        except asyncio.CancelledError:
            call.cancel()
            raise
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                report(True, "no health service (UNIMPLEMENTED): healthy")
                return
            if e.code() == grpc.StatusCode.CANCELLED:
                return  # channel closing
            report(None, f"health watch failed: {e.code().name}")
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, max_backoff)
