"""The ADS endpoint: ``envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources``
(state of the world, xDS v3) on a ``grpc.aio`` server.

Each stream has a ``StreamState`` (``stream.py``) and its waiting responses (``Stream``: at most one per
type, a newer one replacing an unwritten one): a reader task feeds requests to the state machine, a new
snapshot adds the responses it calls for to the streams whose subscriptions it changed, and the handler
writes them. Responses are pre-serialized bytes (``snapshot.Body``), so the method is registered with
an identity response serializer: pushing one snapshot to many streams serializes the resources once. While
streams are open, the collector's first threshold grows with them (``gc_scale.py``).

The server runs on the event loop it is started on (``ControlPlane`` uses waypost's control loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import grpc

from .. import metrics as _metrics
from . import gc_scale
from .csds import add_to_server as add_csds
from .request import parse as parse_request
from .resources import SHORT
from .stream import StreamState

if TYPE_CHECKING:
    from .snapshot import Snapshot

log = logging.getLogger("waypost.xds")

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
METHOD = "StreamAggregatedResources"
#: calls that may wait to be accepted. grpc.aio cancels a new call once more than
#: ``grpc.server.max_pending_requests`` (default 1,000; hard limit 3,000) wait for the event loop to take them:
#: a fleet reconnecting at once (a replica restarted) would see CANCELLED streams and retry with backoff. An ADS
#: stream waiting here costs a few KiB, so the limits are set far above any fleet one process serves.
MAX_PENDING_CALLS = 1_000_000
#: seconds a stream may go on after its connection's GOAWAY (``max_connection_age``)
MAX_AGE_GRACE = 5.0
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),  # a second control plane on the same port is an error, not a silent share
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
]


class Stream:
    """One open ADS stream: its state and the responses not written yet, at most one per type.

    A newer response of a type replaces one still waiting (state of the world: each response carries the whole
    subscribed state, so the newest is all a client needs). A client that reads slowly, or not at all, thus holds
    at most four responses here and delays nobody: its writer waits on its own flow control, and every change
    meanwhile folds into what it gets next."""

    def __init__(self, peer: str) -> None:
        self.state = StreamState(peer)
        self.pending: dict[str, bytes] = {}
        self.wake = asyncio.Event()
        self.closed = False
        self.pushes = 0
        self.replaced = 0

    def send(self, responses: list[tuple[str, bytes]]) -> None:
        """Queue ``responses`` (the caller counts them in the metrics: a push counts them once for every stream)."""
        pending = self.pending
        for t, data in responses:
            if t in pending:
                self.replaced += 1
            pending[t] = data
        self.pushes += len(responses)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    def next_response(self) -> bytes | None:
        """The oldest waiting response (responses go out in the order their types were first queued)."""
        for t in self.pending:
            return self.pending.pop(t)
        return None


def _count_pushes(per_type: Mapping[str, int]) -> None:
    """Count responses queued, per type URL, in the metrics (once per push, not once per stream)."""
    obs = _metrics.current
    if obs is not None:
        for t, n in per_type.items():
            obs.xds_push_many(SHORT[t], n)


class AdsServer:
    """The ADS service over ``snapshot()`` (the current Snapshot); ``streams`` are the open ones."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self.snapshot = snapshot
        self.streams: set[Stream] = set()
        self.nacks = 0
        self.server: grpc.aio.Server | None = None
        self.port = 0
        #: more services on the same server, port and credentials: each is called with the server before it starts
        self.services: list[Callable[[grpc.aio.Server], None]] = []

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=parse_request, response_serializer=lambda data: data)
        return grpc.method_handlers_generic_handler(SERVICE, {METHOD: method})

    async def start(self, listen: str, credentials: grpc.ServerCredentials | None = None, *,
                    reuse_port: bool = False, max_connection_age: float | None = None) -> int:
        """Bind ``listen`` (host:port; port 0: any) and start serving; returns the port. ``reuse_port``: share
        the port with other processes that bind it so (``workers.py``). ``max_connection_age`` (seconds; None:
        never): a connection gets GOAWAY after about that long (gRPC adds +/-10 % jitter, so a fleet that
        connected at once does not reconnect at once), and its stream ends ``MAX_AGE_GRACE`` s later; gRPC's
        clients open a new one, keeping their resources meanwhile, so a fleet spreads again over the replicas
        after one was away."""
        options = [(k, 1 if reuse_port else v) if k == "grpc.so_reuseport" else (k, v) for k, v in SERVER_OPTIONS]
        if max_connection_age:
            options += [("grpc.max_connection_age_ms", max(round(max_connection_age * 1000), 1)),
                        ("grpc.max_connection_age_grace_ms", round(MAX_AGE_GRACE * 1000))]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((self.handler(),))
        add_csds(server, lambda: [s.state for s in self.streams])  # client status, same port and credentials
        for add in self.services:
            add(server)
        port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
        if not port:
            raise OSError(f"xds: cannot listen on {listen}")
        await server.start()
        self.server, self.port = server, port
        return port

    async def stop(self, grace: float = 1.0) -> None:
        for s in list(self.streams):
            s.close()
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    def push(self, snap: Snapshot, changed: Mapping[str, AbstractSet[str]] | None = None) -> int:
        """Queue what ``snap`` changes for every stream; returns the number of responses queued. ``changed``
        (type URL -> resource names added, changed or removed since the last push), when given, spares the
        streams that subscribed to none of them (the work of a push follows what changed, not the fleet)."""
        per_type: dict[str, int] = {}
        if changed is not None:
            changed = {t: names for t, names in changed.items() if names}
            if not changed:
                return 0
        for s in list(self.streams):
            responses = s.state.on_snapshot(snap, changed)
            if responses:
                s.send(responses)
                for t, _ in responses:
                    per_type[t] = per_type.get(t, 0) + 1
        _count_pushes(per_type)
        return sum(per_type.values())

    async def _stream(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        stream = Stream(context.peer())
        self.streams.add(stream)
        gc_scale.opened()
        obs = _metrics.current
        if obs is not None:
            obs.xds_stream(1)
        reader = asyncio.get_running_loop().create_task(self._read(stream, context))
        log.info("xds: stream from %s opened", stream.state.peer)
        try:
            while not stream.closed:
                await stream.wake.wait()
                stream.wake.clear()
                while not stream.closed and (data := stream.next_response()) is not None:
                    await context.write(data)
        finally:
            self.streams.discard(stream)
            gc_scale.closed()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)  # retrieved: the reader ends by itself or here
            obs = _metrics.current
            if obs is not None:
                obs.xds_stream(-1)
            log.info("xds: stream of %s closed (%d responses sent)", stream.state.who, stream.pushes)

    async def _read(self, stream: Stream, context: grpc.aio.ServicerContext) -> None:
        state = stream.state
        try:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                anonymous = state.node is None
                out = state.on_request(req, self.snapshot())
                if anonymous and state.node is not None:
                    log.info("xds: stream from %s is node %r", state.peer, state.node_id)
                if out.kind == "nack":
                    self.nacks += 1
                    obs = _metrics.current
                    if obs is not None:
                        obs.xds_nack(SHORT[req.type_url])
                if out.responses:
                    stream.send(out.responses)
                    _count_pushes({t: 1 for t, _ in out.responses})
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 -- the client went away (or sent garbage): end this stream only
            log.debug("xds: stream of %s: read ended: %r", stream.state.who, e)
        stream.close()
