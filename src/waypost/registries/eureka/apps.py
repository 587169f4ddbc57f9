"""Eureka's registry as JSON, and a client's copy of it: instances in and out, the delta, the reconcile hash.

Metadata values are strings in Eureka: ``encode_metadata`` writes a string that is not JSON text as it is
(``"eu-1"``), any other value as compact JSON (``20`` -> ``"20"``), and quotes a string that would read as JSON or
is empty, so ``decode_metadata`` gives every value back (Spring's ``management.port: "8080"`` decodes the same way).
Eureka writes ``port`` as ``{"$": 8080, "@enabled": "true"}`` and, through some codecs, a list of one element as
the element itself: both forms are read. ``RegistryCopy.hashcode`` is Eureka's reconcile hash code
(``STATUS_COUNT_`` per status, sorted, over every instance): a copy whose hash differs from a delta's
``apps__hashcode`` missed something, and fetches everything again, as Eureka's own client does.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...netutil import AddressError, join_host_port, parse_host_port
from ..http_kind import MalformedAnswer
from ..meta_text import decode_value, encode_value

#: metadata keys Eureka's codecs (JSON and XML) carry: XML names, so Spring's ``management.port`` too
META_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
#: grpc-spring-boot-starter's metadata key for the gRPC port of an instance (its ``port`` is the HTTP one)
GRPC_PORT_KEY = "gRPC_port"


class MalformedInstance(ValueError):
    """One instance of an answer cannot be used (the message says why); it is skipped."""


def encode_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """waypost metadata -> Eureka's (strings); TypeError/ValueError naming an entry Eureka cannot carry."""
    out: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not META_KEY_RE.fullmatch(key):
            raise ValueError(f"metadata key {key!r:.140} cannot be an Eureka metadata key (a letter or '_', then "
                             "letters, digits, '_', '.' and '-'; at most 128)")
        out[key] = encode_value(key, value, quote_empty=True)  # empty: how a key is taken back (below)
    return out


def decode_metadata(meta: Any) -> dict[str, Any]:
    """Eureka's metadata -> waypost's: JSON text decodes, other strings stay; codec markers (``@class``) go, and
    so do empty values (Eureka's metadata API sets keys but cannot remove one: an empty value is how a key is
    taken back)."""
    if not isinstance(meta, Mapping):
        return {}
    return {k: decode_value(v) for k, v in meta.items() if isinstance(k, str) and not k.startswith("@") and v != ""}


def _port(value: Any) -> int | None:
    """A port number: Eureka's ``{"$": 8080, "@enabled": "true"}``, a number or its text; None when absent, disabled
    or no port."""
    if isinstance(value, Mapping):
        value = value.get("$") if str(value.get("@enabled", "true")).lower() != "false" else None
    try:
        port = int(value) if not isinstance(value, bool) else 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return port if 0 < port < 65536 else None


@dataclass(frozen=True)
class Instance:
    """One instance as Eureka holds it (the fields waypost reads) and the JSON it came as."""

    app: str
    id: str
    host: str
    port: int | None
    status: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Any, app: str = "") -> Instance:
        if not isinstance(doc, Mapping):
            raise MalformedInstance(f"an instance is a {type(doc).__name__}, not an object")
        iid, name, host, status = (doc.get("instanceId") or doc.get("hostName"), doc.get("app") or app,
                                   doc.get("ipAddr") or doc.get("hostName"), doc.get("status"))
        if not isinstance(iid, str) or not iid:
            raise MalformedInstance("an instance has no instanceId")
        for value, field_name in ((name, "app"), (host, "ipAddr"), (status, "status")):
            if not isinstance(value, str) or not value:
                raise MalformedInstance(f"instance {iid!r} has no {field_name}")
        metadata = decode_metadata(doc.get("metadata"))
        return cls(str(name).upper(), iid, str(host), _port(doc.get("port")), str(status).upper(), metadata, doc)

    @property
    def address(self) -> str | None:
        """``host:port`` a gRPC client dials, the port metadata ``gRPC_port`` when it is a port number, else
        ``port`` (None: no usable port or host)."""
        port = _port(self.metadata.get(GRPC_PORT_KEY)) or self.port
        if port is None:
            return None
        try:
            host, _ = parse_host_port(join_host_port(self.host, port), what="eureka instance address")
        except AddressError:
            return None
        return join_host_port(host, port)


def as_list(value: Any) -> list[Any]:
    """Eureka's lists: a list, one element written as itself, or nothing."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def applications(body: Any, where: str) -> Mapping[str, Any]:
    """The ``applications`` object of a full or delta answer; ``MalformedAnswer`` when there is none."""
    apps = body.get("applications") if isinstance(body, Mapping) else None
    if not isinstance(apps, Mapping):
        shown = json.dumps(body)[:160] if not isinstance(body, (bytes, str)) else repr(body)[:160]
        raise MalformedAnswer(f"malformed answer from eureka at {where}: no 'applications' object: {shown}")
    return apps


def instances_of(apps: Mapping[str, Any], problems: list[str]) -> Iterable[tuple[Instance, str]]:
    """Every well-formed instance of an ``applications`` object with its ``actionType``; the malformed ones
    are left out, each problem appended to ``problems``."""
    for app in as_list(apps.get("application")):
        if not isinstance(app, Mapping):
            problems.append(f"an application is a {type(app).__name__}, not an object")
            continue
        name = app.get("name")
        for doc in as_list(app.get("instance")):
            try:
                inst = Instance.from_json(doc, name if isinstance(name, str) else "")
            except MalformedInstance as e:
                problems.append(str(e))
                continue
            yield inst, str(doc.get("actionType") or "ADDED").upper()


def reconcile_hashcode(statuses: Iterable[str]) -> str:
    """Eureka's ``Applications.getReconcileHashCode``: ``STATUS_COUNT_`` for each status, sorted."""
    counts = Counter(statuses)
    return "".join(f"{s}_{counts[s]}_" for s in sorted(counts))


class RegistryCopy:
    """A client's copy of the whole registry: app -> instance id -> ``Instance`` (see the module docstring)."""

    def __init__(self) -> None:
        self.apps: dict[str, dict[str, Instance]] = {}
        #: whether a full fetch filled it (a delta only applies to a copy that has one)
        self.filled = False

    def replace(self, apps: Mapping[str, Any], problems: list[str]) -> None:
        """Take a full fetch's ``applications``."""
        self.apps = {}
        for inst, _ in instances_of(apps, problems):
            self.apps.setdefault(inst.app, {})[inst.id] = inst
        self.filled = True

    def apply_delta(self, apps: Mapping[str, Any], problems: list[str]) -> None:
        """Apply a delta's ``applications`` (ADDED/MODIFIED: put; DELETED: remove)."""
        for inst, action in instances_of(apps, problems):
            if action == "DELETED":
                self.apps.get(inst.app, {}).pop(inst.id, None)
                if inst.app in self.apps and not self.apps[inst.app]:
                    del self.apps[inst.app]
            else:
                self.apps.setdefault(inst.app, {})[inst.id] = inst

    def hashcode(self) -> str:
        return reconcile_hashcode(i.status for app in self.apps.values() for i in app.values())

    def instances(self, app: str) -> list[Instance]:
        """The instances of ``app`` (any status), by id."""
        return [self.apps.get(app, {})[i] for i in sorted(self.apps.get(app, {}))]

    def names(self) -> list[str]:
        return sorted(self.apps)
