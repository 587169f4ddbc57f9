"""Client status: ``envoy.service.status.v3.ClientStatusDiscoveryService`` (CSDS) on the ADS server.

``FetchClientStatus`` (unary) and ``StreamClientStatus`` (one response per request) answer with one
``ClientConfig`` per open ADS stream: the Node its client sent, its ``client_scope`` (``xds:///NAME``, the target
a per-target xDS client serves: ``client_scope()``), and one ``GenericXdsConfig`` per resource it subscribed to
(wildcard: every resource of the last response of that type), built from ``StreamState.statuses()``. Several
streams of one node (one process dialing several targets) are each a ClientConfig of their own. How each
resource's state maps to ``config_status`` and ``client_status``: docs/xds.md, "Client status".

``node_matchers`` filter the clients as csds.proto defines them: a client is listed when any matcher matches
(none given: every client); a matcher matches when its ``node_id`` StringMatcher (if set) and every one of its
``node_metadatas`` StructMatchers match. StringMatcher: exact, prefix, suffix, contains (``ignore_case``) and
safe_regex (the whole id; Python's ``re``, which reads RE2's syntax but for its rarest constructs);
ValueMatcher: null, double (exact or range), string, bool, present, list (``one_of``) and or. A ``custom``
StringMatcher (an extension) is refused with INVALID_ARGUMENT naming it, as is a bad regex or an empty
matcher. ``exclude_resource_contents`` leaves ``xds_config`` out.

The servicer runs on the ADS server's event loop, the one the streams' states are changed on: it reads them
without locks.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from envoy.admin.v3 import config_dump_shared_pb2 as dump_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from envoy.type.matcher.v3 import node_pb2, string_pb2, struct_pb2, value_pb2
from google.protobuf import any_pb2
from google.protobuf import struct_pb2 as pb_struct
from google.protobuf.timestamp_pb2 import Timestamp

from .resources import LISTENER
from .stream import ResourceStatus, StreamState

_CONFIG_STATUS = {"synced": csds_pb2.SYNCED, "stale": csds_pb2.STALE, "nacked": csds_pb2.ERROR,
                  "not_sent": csds_pb2.NOT_SENT}
_CLIENT_STATUS = {"acked": dump_pb2.ACKED, "nacked": dump_pb2.NACKED, "requested": dump_pb2.REQUESTED,
                  "does_not_exist": dump_pb2.DOES_NOT_EXIST}


class UnsupportedMatcher(ValueError):
    """A ``node_matchers`` entry this server cannot apply (its message names it)."""


# ------------------------------------------------------------------ matching


def _string_matches(m: string_pb2.StringMatcher, value: str, where: str) -> bool:
    kind = m.WhichOneof("match_pattern")
    if kind is None:
        raise UnsupportedMatcher(f"{where}: a StringMatcher with no match_pattern")
    if kind == "custom":
        raise UnsupportedMatcher(f"{where}.custom: custom string matchers ({m.custom.name or 'unnamed'}) are not "
                                 "supported")
    if kind == "safe_regex":
        try:
            return re.fullmatch(m.safe_regex.regex, value) is not None
        except re.error as e:
            raise UnsupportedMatcher(f"{where}.safe_regex: {m.safe_regex.regex!r} is not a valid regex: {e}") from None
    pattern: str = getattr(m, kind)
    if m.ignore_case:
        pattern, value = pattern.lower(), value.lower()
    if kind == "exact":
        return value == pattern
    if kind == "prefix":
        return value.startswith(pattern)
    if kind == "suffix":
        return value.endswith(pattern)
    return pattern in value  # contains


def _value_matches(m: value_pb2.ValueMatcher, value: pb_struct.Value | None, where: str) -> bool:
    """Envoy's ValueMatcher; ``value`` None: the path names nothing in the metadata."""
    kind = m.WhichOneof("match_pattern")
    have = value.WhichOneof("kind") if value is not None else None
    if kind is None:
        raise UnsupportedMatcher(f"{where}: a ValueMatcher with no match_pattern")
    if kind == "present_match":
        return m.present_match and have is not None
    if kind == "or_match":
        return any(_value_matches(v, value, f"{where}.or_match[{i}]") for i, v in enumerate(m.or_match.value_matchers))
    if kind == "list_match":
        items = value.list_value.values if value is not None and have == "list_value" else []
        return any(_value_matches(m.list_match.one_of, v, f"{where}.list_match.one_of") for v in items)
    if value is None:
        return False
    if kind == "null_match":
        return have == "null_value"
    if kind == "bool_match":
        return have == "bool_value" and value.bool_value == m.bool_match
    if kind == "string_match":
        return have == "string_value" and _string_matches(m.string_match, value.string_value, f"{where}.string_match")
    # double_match
    d, x = m.double_match, value.number_value
    if have != "number_value":
        return False
    if d.WhichOneof("match_pattern") == "exact":
        return x == d.exact
    if d.WhichOneof("match_pattern") == "range":
        return d.range.start <= x < d.range.end
    raise UnsupportedMatcher(f"{where}.double_match: a DoubleMatcher with no match_pattern")


def _metadata_value(metadata: pb_struct.Struct,
                    path: Iterable[struct_pb2.StructMatcher.PathSegment]) -> pb_struct.Value | None:
    """The value at ``path`` in ``metadata`` (None: nothing there)."""
    fields: Any = metadata.fields
    value = None
    for seg in path:
        if fields is None or seg.key not in fields:
            return None
        value = fields[seg.key]
        fields = value.struct_value.fields if value.WhichOneof("kind") == "struct_value" else None
    return value


def node_matches(matcher: node_pb2.NodeMatcher, node: base_pb2.Node, where: str = "node_matchers[0]") -> bool:
    """Whether ``node`` matches ``matcher`` (the module docstring); raises UnsupportedMatcher."""
    ok = True
    if matcher.HasField("node_id"):
        ok = _string_matches(matcher.node_id, node.id, f"{where}.node_id")
    for i, sm in enumerate(matcher.node_metadatas):
        w = f"{where}.node_metadatas[{i}]"
        if not sm.path:
            raise UnsupportedMatcher(f"{w}: a StructMatcher with no path")
        # every matcher is evaluated even once one failed, so an unsupported one is refused whatever the node
        ok = _value_matches(sm.value, _metadata_value(node.metadata, sm.path), f"{w}.value") and ok
    return ok


def check_matchers(matchers: Iterable[node_pb2.NodeMatcher]) -> None:
    """Raise UnsupportedMatcher for a matcher that cannot be applied, whether or not a client is connected."""
    for i, m in enumerate(matchers):
        node_matches(m, base_pb2.Node(), f"node_matchers[{i}]")


# ------------------------------------------------------------------ building the response


def _timestamp(seconds: float) -> Timestamp | None:
    if not seconds:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def generic_config(s: ResourceStatus, with_contents: bool = True) -> csds_pb2.ClientConfig.GenericXdsConfig:
    """One subscribed resource as CSDS tells it."""
    cfg = csds_pb2.ClientConfig.GenericXdsConfig(
        type_url=s.type_url, name=s.name, version_info=s.version, config_status=_CONFIG_STATUS[s.state],
        client_status=_CLIENT_STATUS[s.client], last_updated=_timestamp(s.updated_at))
    if with_contents and s.resource is not None:
        cfg.xds_config.CopyFrom(any_pb2.Any.FromString(s.resource.any_bytes))
    if s.state == "nacked":
        cfg.error_state.CopyFrom(dump_pb2.UpdateFailureState(
            details=s.error, version_info=s.error_version, last_update_attempt=_timestamp(s.error_at)))
    return cfg


def client_scope(st: StreamState) -> str:
    """The data-plane target a stream serves, as ``ClientConfig.client_scope``: ``xds:///NAME`` when it subscribed
    to the one Listener NAME, else "" (no Listener, several, or a wildcard).

    gRPC opens one xDS client, with its own ADS stream, per data-plane target it dials (grpcio and grpc-go
    1.85: two ``xds:///`` channels in one process are two streams of the same node, even over one connection),
    and each such client subscribes to its target's Listener only: the scope tells those streams apart."""
    ts = st.types.get(LISTENER)
    wanted = ts.wanted if ts is not None else None
    if wanted is None or len(wanted) != 1:
        return ""
    (name,) = wanted
    return f"xds:///{name}"


def client_status(streams: Iterable[StreamState],
                  request: csds_pb2.ClientStatusRequest | None = None) -> csds_pb2.ClientStatusResponse:
    """The answer to ``request`` over ``streams`` (one ClientConfig per stream whose node matches); raises
    UnsupportedMatcher."""
    request = request if request is not None else csds_pb2.ClientStatusRequest()
    matchers = list(request.node_matchers)
    check_matchers(matchers)
    out = csds_pb2.ClientStatusResponse()
    for st in sorted(streams, key=lambda s: (s.node_id, client_scope(s), s.peer)):
        node = st.node if st.node is not None else base_pb2.Node()
        if matchers and not any(node_matches(m, node, f"node_matchers[{i}]") for i, m in enumerate(matchers)):
            continue
        config = out.config.add()
        config.node.CopyFrom(node)
        config.client_scope = client_scope(st)
        config.generic_xds_configs.extend(generic_config(s, not request.exclude_resource_contents)
                                          for s in st.statuses())
    return out


# ------------------------------------------------------------------ the service


class CsdsServicer(csds_pb2_grpc.ClientStatusDiscoveryServiceServicer):
    """CSDS over ``streams()`` (the open ADS streams' states), on the ADS server's event loop."""

    def __init__(self, streams: Callable[[], Iterable[StreamState]]) -> None:
        self.streams = streams

    async def _answer(self, request: csds_pb2.ClientStatusRequest,
                      context: grpc.aio.ServicerContext) -> csds_pb2.ClientStatusResponse:
        try:
            return client_status(self.streams(), request)
        except UnsupportedMatcher as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # abort raises; this line only tells type checkers so

    async def FetchClientStatus(self, request: csds_pb2.ClientStatusRequest,
                                context: grpc.aio.ServicerContext) -> csds_pb2.ClientStatusResponse:
        return await self._answer(request, context)

    async def StreamClientStatus(self, request_iterator: AsyncIterator[csds_pb2.ClientStatusRequest],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[csds_pb2.ClientStatusResponse]:
        async for request in request_iterator:
            yield await self._answer(request, context)


def add_to_server(server: grpc.aio.Server, streams: Callable[[], Iterable[StreamState]]) -> None:
    """Serve CSDS on ``server`` (the ADS server: same port, same credentials)."""
    csds_pb2_grpc.add_ClientStatusDiscoveryServiceServicer_to_server(CsdsServicer(streams), server)
