"""A Service's EndpointSlices -> the addresses to dial (pure: no I/O, fed by the k8s resolver's list and watch).

A Service's endpoints are spread over several ``discovery.k8s.io/v1`` EndpointSlices (at most 100 endpoints
each by default, one set per address family), all labelled ``kubernetes.io/service-name=<service>``. The
set of addresses is the union over every slice of the service:

- an endpoint counts when ``conditions.ready`` is true or absent (the API: "nil should be interpreted as
  ready") and it is not ``terminating``; Kubernetes keeps terminating pods in the slices (with
  ``serving``) so that load balancers may drain them, but a client-side balancer must stop sending new
  calls there;
- the port is the slice's port with the target's name, or with the target's number; a slice listing no
  ports (``ports`` null: "all ports", a headless Service without ports) takes the target's number;
- IPv4 and IPv6 slices both count (IPv6 written ``[addr]:port``); FQDN slices are skipped (logged once).

Objects are the raw JSON dicts of the API (what a list or a watch event carries), read defensively: a
malformed slice or endpoint is logged and skipped, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...netutil import join_host_port

log = logging.getLogger("waypost.k8s")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class Endpoint:
    """One address to dial and where it runs (for metadata and logs)."""

    address: str
    pod: str = ""
    node: str = ""
    zone: str = ""


def _is_true_or_absent(value: Any) -> bool:
    return value is None or value is True


def slice_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def slice_port(obj: Mapping[str, Any], port: str) -> int | None:
    """The port of this slice for the target's ``port`` (a number as text, or a port name); None: no match."""
    ports = obj.get("ports")
    numeric = port.isdigit()
    if ports is None or ports == []:
        return int(port) if numeric else None
    if not isinstance(ports, list):
        return None
    for p in ports:
        if not isinstance(p, Mapping):
            continue
        number = p.get("port")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
            continue
        if (p.get("protocol") or "TCP") != "TCP":
            continue
        if numeric and number == int(port):
            return number
        if not numeric and p.get("name") == port:
            return number
    return None


def slice_endpoints(obj: Mapping[str, Any], port: str) -> list[Endpoint]:
    """The dialable endpoints of one slice (ready, not terminating, with the target's port)."""
    address_type = obj.get("addressType")
    if address_type not in ("IPv4", "IPv6"):
        return []
    number = slice_port(obj, port)
    if number is None:
        return []
    out: list[Endpoint] = []
    endpoints = obj.get("endpoints")
    if not isinstance(endpoints, list):
        return out
    for ep in endpoints:
        if not isinstance(ep, Mapping):
            continue
        conditions = ep.get("conditions")
        conditions = conditions if isinstance(conditions, Mapping) else {}
        if not _is_true_or_absent(conditions.get("ready")) or conditions.get("terminating") is True:
            continue
        addresses = ep.get("addresses")
        if not isinstance(addresses, list) or not addresses:
            continue
        # The API: "consumers must handle different types of addresses in the context of their own
        # capabilities"; every address of an endpoint is the same pod, so the first one is used (as kube-proxy does)
        address = addresses[0]
        if not isinstance(address, str) or not address:
            continue
        ref = ep.get("targetRef")
        pod = ref.get("name", "") if isinstance(ref, Mapping) and ref.get("kind", "Pod") == "Pod" else ""
        node, zone = ep.get("nodeName"), ep.get("zone")
        out.append(Endpoint(join_host_port(address, number), pod if isinstance(pod, str) else "",
                            node if isinstance(node, str) else "", zone if isinstance(zone, str) else ""))
    return out


class ServiceSlices:
    """The current EndpointSlices of one service, by slice name, and the endpoints they add up to.

    ``replace(items)`` after a list (or a relist after ``410 Gone``: slices gone meanwhile disappear,
    unchanged ones stay, so nothing is spuriously removed), ``apply(type, obj)`` for each watch event.
    ``endpoints()`` is the merged, deduplicated, sorted list.
    """

    def __init__(self, service: str, port: str) -> None:
        self.service = service
        self.port = port
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._warned: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self._slices)

    def _belongs(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        return isinstance(labels, Mapping) and labels.get(SERVICE_NAME_LABEL) == self.service

    def replace(self, items: Iterable[Any]) -> None:
        fresh: dict[str, Mapping[str, Any]] = {}
        for obj in items:
            if isinstance(obj, Mapping) and slice_name(obj) and self._belongs(obj):
                fresh[slice_name(obj)] = obj
        self._slices = fresh

    def apply(self, event_type: str, obj: Any) -> None:
        """One watch event: ADDED / MODIFIED put the slice, DELETED removes it (others are ignored). A slice
        relabelled away from the service leaves it."""
        if not isinstance(obj, Mapping) or not slice_name(obj):
            log.warning("waypost: k8s: skipping a watch event without a slice name (%s)", event_type)
            return
        name = slice_name(obj)
        if event_type == "DELETED" or not self._belongs(obj):
            self._slices.pop(name, None)
        elif event_type in ("ADDED", "MODIFIED"):
            self._slices[name] = obj

    def endpoints(self) -> list[Endpoint]:
        merged: dict[str, Endpoint] = {}
        for name in sorted(self._slices):
            obj = self._slices[name]
            eps = slice_endpoints(obj, self.port)
            if not eps:
                self._warn_unusable(name, obj)
            for ep in eps:
                merged.setdefault(ep.address, ep)
        return [merged[a] for a in sorted(merged)]

    def _warn_unusable(self, name: str, obj: Mapping[str, Any]) -> None:
        address_type = obj.get("addressType")
        if address_type not in ("IPv4", "IPv6"):
            why = f"address type {address_type!r} (only IPv4 and IPv6 are dialed)"
        elif slice_port(obj, self.port) is None:
            ports = obj.get("ports")
            names = [(p.get("name"), p.get("port")) for p in ports if isinstance(p, Mapping)] \
                if isinstance(ports, list) else ports
            why = f"no TCP port {self.port!r} among its ports {names}"
        else:
            return  # simply no ready endpoints right now
        if (name, why) not in self._warned:
            self._warned.add((name, why))
            log.warning("waypost: k8s: EndpointSlice %s of service %s is skipped: %s", name, self.service, why)
