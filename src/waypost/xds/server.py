"""The ADS endpoint: ``envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources``
(state of the world, xDS v3) on a ``grpc.aio`` server.

Each stream has a ``StreamState`` (``stream.py``) and an outbound queue: a reader task feeds requests to the
state machine, a new snapshot adds the responses it calls for to every stream's queue, and the handler
writes the queue. Responses are pre-serialized bytes (``snapshot.Body``), so the method is registered with
an identity response serializer: pushing one snapshot to many streams serializes the resources once.

The server runs on the event loop it is started on (``ControlPlane`` uses waypost's control loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from .. import metrics as _metrics
from .csds import add_to_server as add_csds
from .resources import SHORT
from .stream import StreamState

if TYPE_CHECKING:
    from .snapshot import Snapshot

log = logging.getLogger("waypost.xds")

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
METHOD = "StreamAggregatedResources"
#: responses a slow stream may have queued before it is cut (a client that stopped reading)
MAX_QUEUED = 1000


class Stream:
    """One open ADS stream: its state and its outbound queue."""

    def __init__(self, peer: str) -> None:
        self.state = StreamState(peer)
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.pushes = 0

    def send(self, responses: list[tuple[str, bytes]]) -> None:
        for t, data in responses:
            if self.queue.qsize() >= MAX_QUEUED:
                log.warning("xds: %s does not read its responses; closing the stream", self.state.who)
                self.queue.put_nowait(None)
                return
            self.queue.put_nowait(data)
            self.pushes += 1
            obs = _metrics.current
            if obs is not None:
                obs.xds_push(SHORT[t])


class AdsServer:
    """The ADS service over ``snapshot()`` (the current Snapshot); ``streams`` are the open ones."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self.snapshot = snapshot
        self.streams: set[Stream] = set()
        self.nacks = 0
        self.server: Any = None
        self.port = 0

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=lambda data: data)
        return grpc.method_handlers_generic_handler(SERVICE, {METHOD: method})

    async def start(self, listen: str, credentials: grpc.ServerCredentials | None = None) -> int:
        """Bind ``listen`` (host:port; port 0: any) and start serving; returns the port."""
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self.handler(),))
        add_csds(server, lambda: [s.state for s in self.streams])  # client status, same port and credentials
        port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
        if not port:
            raise OSError(f"xds: cannot listen on {listen}")
        await server.start()
        self.server, self.port = server, port
        return port

    async def stop(self, grace: float = 1.0) -> None:
        for s in list(self.streams):
            s.queue.put_nowait(None)
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    def push(self, snap: Snapshot) -> int:
        """Queue what ``snap`` changes for every stream; returns the number of responses queued."""
        n = 0
        for s in list(self.streams):
            responses = s.state.on_snapshot(snap)
            s.send(responses)
            n += len(responses)
        return n

    async def _stream(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        stream = Stream(context.peer())
        self.streams.add(stream)
        obs = _metrics.current
        if obs is not None:
            obs.xds_stream(1)
        reader = asyncio.get_running_loop().create_task(self._read(stream, context))
        log.info("xds: stream from %s opened", stream.state.peer)
        try:
            while True:
                data = await stream.queue.get()
                if data is None:
                    break
                await context.write(data)
        finally:
            self.streams.discard(stream)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)  # retrieved: the reader ends by itself or here
            obs = _metrics.current
            if obs is not None:
                obs.xds_stream(-1)
            log.info("xds: stream of %s closed (%d responses sent)", stream.state.who, stream.pushes)

    async def _read(self, stream: Stream, context: grpc.aio.ServicerContext) -> None:
        try:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                first = not stream.state.node_id
                out = stream.state.on_request(req, self.snapshot())
                if first and stream.state.node_id:
                    log.info("xds: stream from %s is node %r", stream.state.peer, stream.state.node_id)
                if out.kind == "nack":
                    self.nacks += 1
                    obs = _metrics.current
                    if obs is not None:
                        obs.xds_nack(SHORT[req.type_url])
                stream.send(out.responses)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- the client went away (or sent garbage): end this stream only
            log.debug("xds: stream of %s: read ended: %r", stream.state.who, e)
        stream.queue.put_nowait(None)
