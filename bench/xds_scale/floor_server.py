"""The floor of ADS on grpc.aio: a server with no control plane in it, for ``bench/xds_scale.py``.

It answers each first request of a type with a canned response (waypost's own resources for one export of 10
endpoints, built once), ignores ACKs, and on ``change`` (stdin) writes a canned new assignment to every open
stream: one write and one read per stream per change, the least any ADS server on grpc.aio does. What
waypost's control plane costs above this is its own; what this costs is grpc.aio's.

With ``--gc-scale`` it scales the collector's young threshold with its streams as waypost's ADS server does
(``waypost.xds.gc_scale``): the floor with the same collector settings.

Prints ``{"listening": "HOST:PORT"}``; each ``change`` is answered by ``{"changed": N}`` once queued.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from waypost.types import Backend
from waypost.xds import gc_scale, parse_export
from waypost.xds.resources import ENDPOINT, load_assignment, pack, static_resources
from waypost.xds.server import SERVER_OPTIONS


def _response(type_url: str, version: str, msg: object) -> bytes:
    resp = discovery_pb2.DiscoveryResponse(version_info=version, type_url=type_url, nonce=version)
    resp.resources.append(pack(msg))  # type: ignore[arg-type]
    return resp.SerializeToString()


async def main() -> None:
    export = parse_export("svc-0=direct:///127.0.0.1:1")
    backends = [Backend(f"10.0.0.{j + 1}:8080") for j in range(10)]
    canned = {t: _response(t, "1", m) for t, m in static_resources(export).items()}
    assignments = [_response(ENDPOINT, str(v), load_assignment(export, backends[: 10 + v % 2])) for v in range(2)]
    canned[ENDPOINT] = assignments[0]
    version = [0]
    queues: set[asyncio.Queue[bytes]] = set()
    scale_gc = "--gc-scale" in sys.argv[1:]

    async def ads(requests: object, context: grpc.aio.ServicerContext) -> object:
        out: asyncio.Queue[bytes] = asyncio.Queue()
        queues.add(out)
        if scale_gc:
            gc_scale.opened()

        async def read() -> None:
            while (req := await context.read()) is not grpc.aio.EOF:
                if not req.response_nonce:
                    out.put_nowait(canned[req.type_url])

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                await context.write(await out.get())
        finally:
            queues.discard(out)
            reader.cancel()
            if scale_gc:
                gc_scale.closed()

    handler = grpc.method_handlers_generic_handler(
        "envoy.service.discovery.v3.AggregatedDiscoveryService",
        {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
            ads, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=lambda data: data)})
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"listening": f"127.0.0.1:{port}"}), flush=True)
    loop = asyncio.get_running_loop()
    while (line := await loop.run_in_executor(None, sys.stdin.readline)) and line.strip() != "quit":
        if line.startswith("change"):
            version[0] += 1
            data = assignments[version[0] % 2]
            for q in list(queues):
                q.put_nowait(data)
            print(json.dumps({"changed": version[0]}), flush=True)
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main())
