"""What a keyed registry holds, as plain data (``waypost ls``, the console's keyed source): ``classify`` recognises
each record's wire format from its shape (kratos keys under ``/microservices/``, etcd-naming JSON with ``Addr``,
go-zero's raw ``host:port``, go-zero metadata side records) and decodes it with that format's own decoder, so
``ls`` shows exactly what a subscriber of that format would see.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .formats import ETCD_NAMING, GOZERO, GOZERO_META_ROOT, KRATOS, valid_address
from .override import OVERRIDE_ROOT


def classify(kvs: Iterable[Any]) -> list[dict[str, Any]]:
    """One dict per registration: service, id, address, format, metadata, lease, key.

    Records that match no format are returned with ``format="?"`` and ``address=None``.
    """
    entries: list[dict[str, Any]] = []
    side: dict[tuple[str, str], dict[str, Any]] = {}
    for kv in kvs:
        key, value = kv.key, kv.value
        if key.startswith(GOZERO_META_ROOT):
            rest = key[len(GOZERO_META_ROOT):]
            if "/" in rest:
                service, ident = rest.rsplit("/", 1)
                meta = GOZERO.decode_side(key, value, f"{GOZERO_META_ROOT}{service}/")
                if meta is not None:
                    side[(service, ident)] = {"address": meta.address, "metadata": dict(meta.metadata)}
            continue
        if key.startswith(OVERRIDE_ROOT):  # an operator's weight override (waypost drain): not a registration
            continue
        entries.append(_one(key, value, kv.lease))
    for e in entries:  # join go-zero metadata by (service, id), only when the address agrees
        m = side.get((e["service"], e["id"])) if e["format"] == "gozero" else None
        if m is not None and m["address"] == e["address"]:
            e["metadata"] = m["metadata"]
    return entries


def printable(key: str) -> str:
    """A registry key safe to print: undecodable bytes (kept by surrogateescape) shown as \\xNN."""
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _one(key: str, value: bytes, lease: int) -> dict[str, Any]:
    key = printable(key)
    service, _, ident = key.rpartition("/")
    if not service:  # a key without '/': go-zero's exact-match registration
        service, ident = key, ""
    out: dict[str, Any] = {"key": key, "service": service, "id": ident, "lease": lease, "address": None,
                           "format": "?", "metadata": {}}
    text = value[:65536].decode("utf-8", "replace").strip()
    entry = None
    if key.startswith(KRATOS.namespace + "/") and text.startswith("{"):
        out["format"], entry = "kratos", KRATOS.decode(key, value)
        out["service"] = service[len(KRATOS.namespace) + 1:]
    elif text.startswith("{") and '"Addr"' in text:
        out["format"], entry = "etcd-naming", ETCD_NAMING.decode(key, value)
    elif valid_address(text):
        out["format"], entry = "gozero", GOZERO.decode(key, value)
    else:
        out["value"] = text[:80]
    if entry is not None:
        out["address"] = entry.address
        out["metadata"] = dict(entry.metadata)
    elif out["format"] != "?":
        out["format"] += " (bad value)"
        out["value"] = text[:80]
    return out
