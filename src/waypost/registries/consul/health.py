"""Reading the health API's answer (``/v1/health/service/<name>``) into instances, defensively.

Consul answers a list of entries, each ``{"Node": {...}, "Service": {...}, "Checks": [...]}``. Whatever sits at
the agent's address may answer something else: a proxy's error page served as 200, another server's JSON, a
truncated or altered list. ``read_entries`` never raises on such content: each entry that is not the shape
Consul gives is set aside with a short description of what is wrong with it (the same text for the same
problem, so a caller can report each distinct problem once), and every well-formed entry is kept.

An entry of the right shape without a usable address (no host, a port outside 1-65535) is not malformed: Consul
accepts such registrations (a service registered without a port, say). It is skipped and listed apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...netutil import join_host_port
from .api import MalformedAnswer, decode_meta

__all__ = ["Entries", "Instance", "MalformedAnswer", "read_entries"]


@dataclass(frozen=True)
class Instance:
    """One passing instance: its service ID, ``host:port`` and decoded metadata (Meta, plus ``tags``)."""

    id: str
    address: str
    metadata: Mapping[str, Any]


@dataclass
class Entries:
    """What ``read_entries`` made of an answer."""

    instances: list[Instance] = field(default_factory=list)
    #: one description per malformed entry (entries with the same problem share a text)
    malformed: list[str] = field(default_factory=list)
    #: service IDs of well-formed entries without a usable address
    unusable: list[str] = field(default_factory=list)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_entry(entry: Any) -> str | None:
    """What is wrong with the shape of one health entry, or None when it is one Consul would give."""
    if not isinstance(entry, Mapping):
        return f"an entry is a {_kind(entry)}, not an object"
    svc, node = entry.get("Service"), entry.get("Node")
    if not isinstance(svc, Mapping):
        return f"an entry's 'Service' is a {_kind(svc)}, not an object"
    if node is not None and not isinstance(node, Mapping):
        return f"an entry's 'Node' is a {_kind(node)}, not an object"
    for name, value, kinds in (("Service.ID", svc.get("ID"), (str,)), ("Service.Address", svc.get("Address"), (str,)),
                               ("Node.Address", (node or {}).get("Address"), (str,)),
                               ("Service.Meta", svc.get("Meta"), (Mapping,)),
                               ("Service.Tags", svc.get("Tags"), (list,))):
        if value is not None and not isinstance(value, kinds):
            return f"an entry's '{name}' is a {_kind(value)}"
    port = svc.get("Port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
        return f"an entry's 'Service.Port' is a {_kind(port)}, not a number"
    return None


def read_entries(body: Any) -> Entries:
    """The instances of a health answer's entries (``body`` must already be a list), in the answer's order."""
    out = Entries()
    for entry in body:
        problem = _check_entry(entry)
        if problem is not None:
            out.malformed.append(problem)
            continue
        svc, node = entry["Service"], entry.get("Node") or {}
        host = svc.get("Address") or node.get("Address") or ""
        port = svc.get("Port")
        sid = svc.get("ID") or ""
        if not host or not isinstance(port, int) or not 0 < port < 65536:
            out.unusable.append(sid)
            continue
        out.instances.append(Instance(sid, join_host_port(host.strip("[]"), port),
                                      decode_meta(svc.get("Meta"), svc.get("Tags"))))
    return out
