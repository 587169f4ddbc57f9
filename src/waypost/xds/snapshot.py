"""Immutable snapshots of every served resource, and the bytes of the responses built from them.

A snapshot maps each type URL to ``{name: Resource}``; a Resource holds the serialized ``Any`` and a digest
of it. A change in a source builds a new snapshot (the resources of unchanged services are reused); nothing
in a snapshot is ever mutated, so streams read it without locks.

**Versions are derived from content**: the ``version_info`` of a response is a hash of the type and of the
digests of the resources it carries (sorted by name). Two control-plane replicas with the same exports and
the same backend lists therefore send the same version for the same resources, and a client that fails over
from one to the other sees no change (it gets the same resources under the same version; nothing is rebuilt
in its balancer). A counter would differ between replicas and restart from 1 after a restart.

A response is built once per (type, subscribed names) and snapshot, its nonce included, and its bytes are
shared by every stream that subscribed to the same names: a push to many streams serializes the resources once,
and each stream's part of it is a dictionary lookup (``Snapshot.body``).

**Nonces are per response built, not per stream**: a process-wide counter numbers each ``Body``, so the nonces a
stream gets increase with the snapshots. Within one snapshot a stream gets the same Body twice only when its
subscription went back to names it had (A, B, A): the request that went back carried B's nonce, so every later
request from that client carries B's nonce or a newer one, and none that answered the first A can be taken for an
answer to the second (requests on a stream arrive in order).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import Message

from .resources import CLUSTER, ENDPOINT, FULL_STATE, LISTENER, TYPES, not_exported_listener, pack


@dataclass(frozen=True)
class Resource:
    """One resource, serialized once: the bytes of its ``Any`` and their digest."""

    name: str
    any_bytes: bytes
    digest: bytes

    @classmethod
    def of(cls, name: str, msg: Message) -> Resource:
        data = pack(msg).SerializeToString(deterministic=True)
        return cls(name, data, hashlib.sha256(data).digest()[:16])


@lru_cache(maxsize=1024)  # the same typo from many clients is built once
def not_exported(name: str) -> Resource:
    """The Listener answering a subscription to ``name``, which is not exported (``resources.not_exported_listener``)."""
    return Resource.of(name, not_exported_listener(name))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


# DiscoveryResponse field numbers (envoy/service/discovery/v3/discovery.proto)
_VERSION, _RESOURCES, _TYPE_URL, _NONCE = 1, 2, 4, 5
assert discovery_pb2.DiscoveryResponse.DESCRIPTOR.fields_by_name["nonce"].number == _NONCE


def version_of(type_url: str, resources: Iterable[Resource], absent: Iterable[str] = ()) -> str:
    """The version of a response carrying ``resources`` and, for a full-state type, telling that the names in
    ``absent`` do not exist (a response that answers one more unknown name is a new version)."""
    h = hashlib.sha256(type_url.encode())
    for r in resources:
        h.update(r.name.encode() + b"\0" + r.digest)
    for name in absent:
        h.update(b"\1" + name.encode())
    return h.hexdigest()[:16]


#: the nonces of the responses built (``Body``), in this process
_nonces = itertools.count(1)


@dataclass(frozen=True)
class Body:
    """One response: ``response``, its bytes (nonce included), shared by every stream it goes to; ``data``, the same
    without the nonce (equal in every replica). ``resources`` are what it carries (``names`` their names),
    ``absent`` the subscribed names it tells do not exist (full-state types)."""

    version: str
    resources: tuple[Resource, ...]
    data: bytes
    absent: tuple[str, ...]
    nonce: str
    response: bytes

    @classmethod
    def build(cls, type_url: str, resources: tuple[Resource, ...], absent: tuple[str, ...]) -> Body:
        """The response of ``type_url`` carrying ``resources`` (sorted by name) and telling ``absent`` do not
        exist, under the next nonce."""
        version = version_of(type_url, resources, absent)
        parts = [_field(_VERSION, version.encode())]
        parts += [_field(_RESOURCES, r.any_bytes) for r in resources]
        parts.append(_field(_TYPE_URL, type_url.encode()))
        data = b"".join(parts)
        nonce = str(next(_nonces))
        return cls(version, resources, data, absent, nonce, data + _field(_NONCE, nonce.encode()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.resources)


@dataclass(frozen=True)
class Snapshot:
    """Every resource served now, per type URL (module docstring)."""

    resources: Mapping[str, Mapping[str, Resource]]
    #: the responses built, by what they carry, and by subscription (the lookup of every stream's push)
    _bodies: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Body] = field(default_factory=dict, compare=False,
                                                                             repr=False)
    _answers: dict[str, dict[frozenset[str] | None, Body | None]] = field(default_factory=dict, compare=False,
                                                                         repr=False)
    _unknown: dict[tuple[str, frozenset[str]], tuple[str, ...]] = field(default_factory=dict, compare=False,
                                                                        repr=False)

    @classmethod
    def empty(cls) -> Snapshot:
        return cls({t: {} for t in TYPES})

    def names(self, type_url: str) -> Mapping[str, Resource]:
        return self.resources.get(type_url, {})

    def body(self, type_url: str, wanted: frozenset[str] | None) -> Body | None:
        """The response to a subscription (``wanted`` None: wildcard), or None when there is nothing to say.

        A name subscribed to but not served (not exported, or its endpoints not known yet):

        - Listener: answered with ``not_exported(name)``, a Listener that fails the client's calls at once (its
          docstring says why leaving it out is not enough);
        - Cluster: left out of a response that is sent anyway, even with no resource (state of the world's
          "does not exist" for full-state types; the version covers the names left out);
        - Route, Endpoint: not answered (leaving a name out says nothing for these types).
        """
        answers = self._answers.get(type_url)
        if answers is None:
            answers = self._answers[type_url] = {}
        try:
            return answers[wanted]
        except KeyError:
            body = answers[wanted] = self._build(type_url, wanted)  # a benign race at worst builds it twice
            return body

    def _build(self, type_url: str, wanted: frozenset[str] | None) -> Body | None:
        have = self.names(type_url)
        names = tuple(sorted(have if wanted is None else (n for n in wanted if n in have)))
        unknown = tuple(sorted(wanted - have.keys())) if wanted is not None and type_url in FULL_STATE else ()
        placeholders, absent = ((unknown, ()) if type_url == LISTENER else ((), unknown))
        if not names and not unknown:
            return None
        key = (type_url, names, unknown)
        body = self._bodies.get(key)  # subscriptions that differ only in names not served share one
        if body is None:
            items = sorted([have[n] for n in names] + [not_exported(n) for n in placeholders], key=lambda r: r.name)
            body = self._bodies[key] = Body.build(type_url, tuple(items), absent)
        return body

    def known(self, type_url: str) -> Mapping[str, Resource]:
        """The names a subscription of ``type_url`` may name: the resources of that type served now (an export's
        Listener, Route and Cluster, and its subsets' Clusters, ``NAME/KEY=VALUE``); for an assignment, every
        Cluster's, whether its endpoints are known yet or not."""
        return self.names(CLUSTER if type_url == ENDPOINT else type_url)

    def unknown(self, type_url: str, wanted: frozenset[str]) -> tuple[str, ...]:
        """The names of ``wanted`` that are not ``known`` (once per subscription and snapshot)."""
        key = (type_url, wanted)
        try:
            return self._unknown[key]
        except KeyError:
            known = self.known(type_url)
            names = self._unknown[key] = tuple(sorted(n for n in wanted if n not in known))
            return names

    def count(self) -> dict[str, int]:
        return {t: len(self.names(t)) for t in TYPES}
