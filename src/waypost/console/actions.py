"""Operator actions on a registration: drain (weight 0), set a weight, undo. Each writes or deletes the override
record the instance's ``Publisher`` follows (``waypost.discovery.override``), and logs one audit line: who (the
remote address, or the user for the CLI), what, when."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..discovery.override import encode_override, override_key, parse_override
from ..discovery.store import Registry
from ..netutil import check_dialable, split_host_port

audit = logging.getLogger("waypost.console.audit")

#: the largest weight accepted (a registration's weight is an int; this keeps typos like 1e9 out)
MAX_WEIGHT = 1_000_000


class ActionError(ValueError):
    """A request that cannot be done as asked (bad key, address or weight): HTTP 400, CLI error line."""


@dataclass(frozen=True)
class Action:
    verb: str  # drain | weight | undrain
    key: str
    address: str
    weight: int | None  # None for undrain

    def describe(self) -> str:
        if self.verb == "undrain":
            return f"undrain {self.key} {self.address} (override removed)"
        return f"{self.verb} {self.key} {self.address} -> weight {self.weight}"


def make_action(verb: str, body: Any) -> Action:
    """Validate a request: ``{key, address[, weight]}`` (weight only for ``weight``)."""
    if verb not in ("drain", "weight", "undrain"):
        raise ActionError(f"unknown action {verb!r}")
    if not isinstance(body, dict):
        raise ActionError("the body must be a JSON object {key, address[, weight]}")
    key, address = body.get("key"), body.get("address")
    if not isinstance(key, str) or not key or key.endswith("/") or len(key) > 1024:
        raise ActionError(f"key: a service key such as 'greet.rpc' is needed, got {key!r}")
    if not isinstance(address, str) or not address:
        raise ActionError(f"address: host:port is needed, got {address!r}")
    try:
        check_dialable(address, what="address")
        if not address.startswith(("unix:", "unix-abstract:")) and split_host_port(address)[1] is None:
            raise ActionError(f"address {address!r}: host:port is needed (example: 10.0.0.5:8080)")
    except ValueError as e:
        raise ActionError(str(e)) from None
    weight: int | None = None
    if verb == "drain":
        weight = 0
    elif verb == "weight":
        w = body.get("weight")
        if isinstance(w, str) and w.strip().isdigit():
            w = int(w.strip())
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_WEIGHT:
            raise ActionError(f"weight: a whole number from 0 to {MAX_WEIGHT} is needed, got {w!r}")
        weight = w
    return Action(verb, key, address, weight)


async def apply(registry: Registry | Any, action: Action, who: str, *, source: str = "") -> dict[str, Any]:
    """Write (or delete) the override record in ``registry`` (a Registry, or a store with its ``put`` and
    ``delete``, such as a Consul agent's KV store); returns what was done. Logs the audit line."""
    rk = override_key(action.key, action.address)
    at = time.time()
    previous = None
    if action.weight is None:
        res = await registry.delete(rk, prev_kv=True)
        previous = parse_override(res.prev_kvs[0].value) if res.prev_kvs else None
    else:
        put = await registry.put(rk, encode_override(action.weight, who, at), prev_kv=True)
        previous = parse_override(put.prev_kv.value) if put.prev_kv is not None else None
    audit.warning("audit: %s by %s at %s%s%s", action.describe(), who,
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), f" in {source}" if source else "",
                  f" (was weight {previous['weight']} by {previous.get('by')})" if previous else "")
    return {"ok": True, "action": action.verb, "key": action.key, "address": action.address,
            "weight": action.weight, "record": rk, "by": who, "at": at, "previous": previous}
