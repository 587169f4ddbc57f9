"""The state of one ADS stream (state of the world): subscriptions, versions, nonces, ACK and NACK.

No I/O here: ``on_request`` (a ``request.Request``) and ``on_snapshot`` return the responses to write, so the
rules are tested without a network. Per type URL a stream remembers what it subscribed to, the version and nonce of the
last response sent, and the last version the client accepted.

- A request whose ``response_nonce`` is not the nonce of the last response of that type is **stale** (it
  answers an older response): ignored, as the protocol says, since a newer response is on its way.
- A request answering the last response with ``error_detail`` is a **NACK**: logged with the client's
  message, counted; the client keeps the last version it accepted (its ``version_info``), and the server does
  not send the rejected version again (it would be rejected again); the next change sends a new one.
- Otherwise it is an **ACK** (or the first request of that type): the subscription is updated and a response
  is sent when the subscribed resources' version differs from the last one sent.
- ``node`` (the whole Node message) is remembered from the first request that carries it (grpcio and grpc-go
  send it only once).

For client status (``csds.py``) a stream also keeps, per type, the resources of the last response sent, when it
was sent, whether the client ACKed or NACKed it (with the NACK's message and time), and the resources of the last
response it ACKed. In state of the world an ACK or NACK answers a whole response, so every resource of that
response shares its state: ``statuses()`` lists one ``ResourceStatus`` per subscribed resource.
- Empty ``resource_names`` in the first LDS or CDS request (or ``*``) is a wildcard: every exported one.
- A name this control plane does not serve (a name not exported, a typo) is logged once per stream, with the
  exported names and the closest name of its type when one is close; the names of subsets' clusters and of
  assignments still waiting for their endpoints are served names. It is answered as ``Snapshot.body`` says: a
  Listener of that name that fails the client's calls at once (so a typo'd ``xds:///NAME`` fails in
  milliseconds, not after the client's 15 s does-not-exist timer), a Cluster response without it, and no Route
  or Endpoint response. Exported later, it is served as soon as it is.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2

from .request import Request
from .resources import CLUSTER, ENDPOINT, FULL_STATE, LISTENER, SHORT
from .snapshot import Body, Resource, Snapshot

log = logging.getLogger("waypost.xds")
#: what a stream answers for a name that is not exported, per type (``Snapshot.body``)
_UNKNOWN_ANSWER = {LISTENER: "answered with a Listener that fails its calls at once",
                   CLUSTER: "answered without it (it does not exist)"}


@dataclass
class TypeState:
    """What one stream knows about one resource type."""

    wanted: frozenset[str] | None = frozenset()  # None: wildcard
    #: the last response sent (shared with every stream it went to: ``snapshot.Body``), and when it was queued
    #: (wall clock, seconds)
    sent: Body | None = None
    sent_at: float = 0.0
    acked_version: str = ""
    nacked_version: str = ""
    nacks: int = 0
    requests: int = 0
    #: what the client answered to the last response sent: "" (nothing yet), "ack" or "nack"
    answer: str = ""
    #: the last response the client ACKed
    acked: Body | None = None
    #: the last NACK: the client's message and when it came (wall clock)
    nack_message: str = ""
    nack_at: float = 0.0

    @property
    def sent_version(self) -> str:
        return self.sent.version if self.sent is not None else ""


@dataclass(frozen=True)
class ResourceStatus:
    """One subscribed resource as this stream's client holds it (``StreamState.statuses``).

    ``state``: ``synced`` (the client ACKed the response that carried it), ``stale`` (sent, not answered yet),
    ``nacked`` (the client rejected that response), ``not_sent`` (subscribed, nothing sent: not exported, or no
    endpoints yet). ``client``: what the client holds: ``acked``, ``nacked``, ``requested`` (nothing accepted
    yet) or ``does_not_exist`` (a full-state response it ACKed said so)."""

    type_url: str
    name: str
    state: str
    client: str
    version: str = ""
    resource: Resource | None = None
    updated_at: float = 0.0
    error: str = ""
    error_version: str = ""
    error_at: float = 0.0


@dataclass
class Outcome:
    """What a request was: ``kind`` (initial, ack, nack, stale), the responses to write as (type, bytes), and
    the NACK's message."""

    kind: str
    responses: list[tuple[str, bytes]] = field(default_factory=list)
    error: str = ""


class StreamState:
    """One ADS stream's view (module docstring). ``peer`` only names it in logs; ``clock`` stamps the times
    client status reports (wall clock)."""

    def __init__(self, peer: str = "?", clock: Callable[[], float] = time.time) -> None:
        self.peer = peer
        self.node: base_pb2.Node | None = None
        self.clock = clock
        self.types: dict[str, TypeState] = {}
        self._unknown_logged: set[tuple[str, str]] = set()

    @property
    def node_id(self) -> str:
        return self.node.id if self.node is not None else ""

    @property
    def who(self) -> str:
        return f"node {self.node_id or '?'} ({self.peer})"

    def on_request(self, req: Request, snap: Snapshot) -> Outcome:
        if self.node is None and req.node is not None:
            self.node = base_pb2.Node()
            self.node.CopyFrom(req.node)
        t = req.type_url
        ts = self.types.get(t)
        first = ts is None
        if ts is None:
            if t not in SHORT:
                log.warning("xds: %s asked for unknown type %r: ignored", self.who, t[:120])
                return Outcome("unknown")
            ts = self.types[t] = TypeState()
        ts.requests += 1
        nonce = req.response_nonce
        kind, error = "initial", ""
        if nonce:
            sent = ts.sent
            if sent is None or nonce != sent.nonce:
                return Outcome("stale")
            if req.error is not None:
                kind, error = "nack", req.error
                ts.nacks += 1
                ts.nacked_version = sent.version
                ts.answer, ts.nack_message, ts.nack_at = "nack", error, self.clock()
                log.warning("xds: %s rejected %s version %s (nonce %s), keeps version %r: %s", self.who, SHORT[t],
                            sent.version, nonce, req.version_info, error[:2000])
            else:
                kind = "ack"
                ts.acked_version, ts.answer, ts.acked = req.version_info, "ack", sent
        names = req.names
        if t in FULL_STATE and ("*" in names or (first and not names)):
            ts.wanted = None
        elif not (ts.wanted is None and not names):
            ts.wanted = names - {"*"} if "*" in names else names
        self._log_unknown(t, ts.wanted, snap)
        out = Outcome(kind, error=error)
        resp = self._response(t, ts, snap)
        if resp is not None:
            out.responses.append(resp)
        return out

    def on_snapshot(self, snap: Snapshot, changed: Mapping[str, AbstractSet[str]] | None = None) -> list[tuple[str, bytes]]:
        """The responses a new snapshot calls for (only the types whose subscribed resources changed).
        ``changed`` (type URL -> names whose resource changed), when given, skips at once the types where this
        stream subscribed to none of them; without it every subscribed type is compared. Called for every stream
        on every push: its cost is the push's, per stream."""
        out = []
        if changed is None:
            for t, ts in self.types.items():
                self._log_unknown(t, ts.wanted, snap)
                resp = self._response(t, ts, snap)
                if resp is not None:
                    out.append(resp)
            return out
        for t, names in changed.items():  # in TYPES order (a Cluster before its assignment)
            if not names:
                continue
            subscribed = self.types.get(t)
            if subscribed is None:
                continue
            wanted = subscribed.wanted
            if wanted is not None and wanted.isdisjoint(names):
                continue
            self._log_unknown(t, wanted, snap)
            resp = self._response(t, subscribed, snap)
            if resp is not None:
                out.append(resp)
        return out

    def _response(self, t: str, ts: TypeState, snap: Snapshot) -> tuple[str, bytes] | None:
        body = snap.body(t, ts.wanted)
        sent = ts.sent
        if body is None or (sent is not None and body.version == sent.version):
            return None  # nothing served, or the client has (or rejected) exactly this
        ts.sent, ts.sent_at, ts.answer = body, self.clock(), ""
        return t, body.response

    def statuses(self) -> list[ResourceStatus]:
        """One ``ResourceStatus`` per subscribed resource, per type (wildcard: every resource of the last response
        of that type); sorted by type, then name."""
        out: list[ResourceStatus] = []
        for t, ts in sorted(self.types.items()):
            sent = {r.name: r for r in ts.sent.resources} if ts.sent is not None else {}
            absent = ts.sent.absent if ts.sent is not None else ()
            acked_names = {r.name for r in ts.acked.resources} if ts.acked is not None else set()
            names = sorted(sent) if ts.wanted is None else sorted(ts.wanted)
            for name in names:
                r = sent.get(name)
                if r is None:
                    acked_absent = ts.answer == "ack" and name in absent
                    out.append(ResourceStatus(t, name, "not_sent", "does_not_exist" if acked_absent else "requested",
                                              updated_at=ts.sent_at if acked_absent else 0.0))
                    continue
                state, client = {"ack": ("synced", "acked"), "nack": ("nacked", "nacked")}.get(
                    ts.answer, ("stale", "acked" if name in acked_names else "requested"))
                nacked = state == "nacked"
                out.append(ResourceStatus(t, name, state, client, ts.sent_version, r, ts.sent_at,
                                          ts.nack_message if nacked else "", ts.nacked_version if nacked else "",
                                          ts.nack_at if nacked else 0.0))
        return out

    def _log_unknown(self, t: str, wanted: frozenset[str] | None, snap: Snapshot) -> None:
        if not wanted:
            return
        for name in snap.unknown(t, wanted):
            if (t, name) in self._unknown_logged:
                continue
            self._unknown_logged.add((t, name))
            exported = snap.names(LISTENER)
            close = difflib.get_close_matches(name, snap.known(t), n=1)
            log.warning("xds: %s subscribed to %s %r, which is not exported (exported: %s)%s; %s",
                        self.who, SHORT[t], name[:200], ", ".join(sorted(exported)[:20]) or "none",
                        f"; did you mean {close[0]!r}?" if close else "", _UNKNOWN_ANSWER.get(t, "not answered"))

    def summary(self) -> dict[str, object]:
        return {SHORT[t]: {"wanted": "*" if ts.wanted is None else sorted(ts.wanted), "sent": ts.sent_version,
                           "acked": ts.acked_version, "nacks": ts.nacks} for t, ts in self.types.items()}


__all__ = ["ENDPOINT", "Outcome", "Request", "ResourceStatus", "StreamState", "TypeState"]
