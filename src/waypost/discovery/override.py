"""Operator overrides of a registration's weight: the record layout.

An operator (``waypost drain``, the web console) writes one record per service key and address::

    _waypost/override/<key>/<address>  ->  {"weight": 0, "by": "127.0.0.1", "at": 1767312000.5}

with no lease: it stays until it is deleted (``waypost undrain``), also across restarts of the instance.
``<key>`` is the key the publisher was given (the service name for Kratos), ``<address>`` the address it
registers. The registration of that key and address follows the record (through its kind's ``OverrideStore``;
etcd's and memory's: ``waypost.registries.etcd.overrides``) and registers its metadata with ``weight`` replaced
by the override's (``apply_override``), so everyone reading the registration sees the new weight, and the guard
puts back *that* metadata. Deleting the record gives the registration its own metadata back.

Only ``weight`` is taken from the record; ``by`` and ``at`` say who wrote it and when (Unix time), for
people. A record that is no JSON object with a non-negative integer ``weight`` is ignored (logged once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

OVERRIDE_ROOT = "_waypost/override/"


def override_key(key: str, address: str) -> str:
    """Where the override of ``address`` registered under ``key`` lives."""
    return f"{OVERRIDE_ROOT}{key}/{address}"


def split_override_key(record_key: str) -> tuple[str, str] | None:
    """``(key, address)`` of an override record's key; None for any other key."""
    if not record_key.startswith(OVERRIDE_ROOT):
        return None
    key, sep, address = record_key[len(OVERRIDE_ROOT):].rpartition("/")
    return (key, address) if sep and key and address else None


def encode_override(weight: int, by: str, at: float) -> bytes:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise ValueError(f"an override weight is a whole number >= 0, got {weight!r}")
    return json.dumps({"weight": weight, "by": by, "at": round(at, 3)}, sort_keys=True).encode()


def parse_override(value: bytes) -> dict[str, Any] | None:
    """The record as a dict with an int ``weight`` >= 0, or None when it is not a valid override."""
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    w = doc.get("weight")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 or w != int(w):
        return None
    return {**doc, "weight": int(w)}


def apply_override(metadata: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metadata to register: ``metadata`` with ``weight`` from ``override`` (unchanged without one)."""
    if override is None:
        return dict(metadata) if metadata else None
    return {**(metadata or {}), "weight": override["weight"]}
