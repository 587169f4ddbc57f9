"""An ADS request as a stream's state machine reads it (``Request``), parsed once per distinct bytes (``parse``).

Every client of one subscription answers a response with the same bytes: the same type, version, nonce (a
response is shared by the streams it goes to: ``snapshot.py``) and names. A push to S streams thus brings back S
equal ACKs; ``parse`` keeps the requests it parsed by their bytes, so those cost one parse and S dictionary
lookups, and the streams of one subscription share one frozenset of names. A request carrying a Node (the first
of a stream: unique to its client) is not kept; the cache holds at most ``CACHE_SIZE`` requests and starts over
when full.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

#: distinct requests kept (a few per subscription and version in flight)
CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Request:
    """What a ``DiscoveryRequest`` says: ``names`` are its ``resource_names``, ``error`` the message of its
    ``error_detail`` (None: no error_detail, so not a NACK), ``node`` its Node (None: not sent)."""

    type_url: str
    version_info: str
    response_nonce: str
    names: frozenset[str]
    error: str | None = None
    node: base_pb2.Node | None = None

    @classmethod
    def of(cls, req: discovery_pb2.DiscoveryRequest) -> Request:
        return cls(req.type_url, req.version_info, req.response_nonce, frozenset(req.resource_names),
                   req.error_detail.message if req.HasField("error_detail") else None,
                   req.node if req.HasField("node") else None)


_parsed: dict[bytes, Request] = {}


def parse(data: bytes) -> Request:
    """The request in ``data`` (a serialized ``DiscoveryRequest``; its parse errors are raised)."""
    req = _parsed.get(data)
    if req is None:
        req = Request.of(discovery_pb2.DiscoveryRequest.FromString(data))
        if req.node is None:
            if len(_parsed) >= CACHE_SIZE:
                _parsed.clear()
            _parsed[data] = req
    return req
