"""Per-method request costs: ``{"methodCosts": {"/pkg.Svc/Heavy": 5}}`` in a policy's config.

A call of a listed method counts as ``cost`` calls in flight at its backend (from its pick until it ends)
instead of 1, for the policies that balance on calls in flight (least_request, peak_ewma): a backend busy
with one heavy call then looks as loaded as one with five light ones. Methods not listed cost 1. Names are
full gRPC method names (``/package.Service/Method``, as ``PickInfo.method`` carries them); costs are whole
numbers from 1 to ``MAX_COST``, so in-flight counts stay exact integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidServiceConfig

__all__ = ["FIELD", "MAX_COST", "parse_costs"]

FIELD = "methodCosts"
MAX_COST = 1000


def parse_costs(cfg: dict[str, Any], path: str) -> None:
    """Validate ``cfg["methodCosts"]`` in place (a JSON object: method name -> whole number) when present."""
    if FIELD not in cfg:
        return
    raw = cfg[FIELD]
    where = f"{path}.{FIELD}"
    if not isinstance(raw, Mapping):
        raise InvalidServiceConfig(f"{where}: expected a JSON object of method name -> cost, got {raw!r}")
    out: dict[str, int] = {}
    for name, cost in raw.items():
        at = f"{where}[{name!r}]"
        if not isinstance(name, str) or not _is_method(name):
            raise InvalidServiceConfig(f"{at}: expected a full method name like '/package.Service/Method'")
        if isinstance(cost, float) and cost.is_integer():
            cost = int(cost)
        if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
            raise InvalidServiceConfig(f"{at}: expected a whole number from 1 to {MAX_COST}, got {cost!r}")
        out[name] = cost
    cfg[FIELD] = out


def _is_method(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "" and bool(parts[1]) and bool(parts[2]) and name == name.strip()
