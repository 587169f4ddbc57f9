"""The field checks of a config object: a policy's ``loadBalancingConfig`` entry, and (through
``service_config.fields``) every object of a service config.

Every policy rejects the fields it does not know, with one message shape, so a typo never passes silently:
``<path>.<field>: unknown field for <owner> (did you mean 'x'?); expected one of: a, b`` (``(it takes no
fields)`` for a policy without settings). The first unknown field in the object's order is the one named. Every
failure is an ``InvalidServiceConfig`` whose message starts with the JSON path.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ..errors import InvalidServiceConfig, did_you_mean

__all__ = ["check_fields", "first_unknown", "parse_config_object", "policy_config"]


def parse_config_object(raw: object, path: str) -> dict[str, Any]:
    """A config object as a fresh dict: absent (None) -> ``{}``, anything but a JSON object -> an error."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidServiceConfig(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return dict(raw)


def first_unknown(obj: Mapping[str, Any], known: Collection[str]) -> str | None:
    """The first key of ``obj`` (in its order) that is not in ``known``; None when all are known."""
    return next((name for name in obj if name not in known), None)


def check_fields(obj: Mapping[str, Any], path: str, known: Collection[str], *, owner: str = "",
                 note: str = "") -> None:
    """Raise for the first field of ``obj`` not in ``known``. ``owner`` names what the fields belong to (a
    policy); ``note`` ends the message. ``known`` is listed in its order, a set sorted."""
    name = first_unknown(obj, known)
    if name is None:
        return
    where = f"{path}.{name}" if path else name
    listed = sorted(known) if isinstance(known, (set, frozenset)) else list(known)
    expected = f"; expected one of: {', '.join(listed)}" if listed else " (it takes no fields)"
    whose = f" for {owner}" if owner else ""
    raise InvalidServiceConfig(f"{where}: unknown field{whose}{did_you_mean(name, listed)}{expected}{note}")


def policy_config(raw: object, path: str, owner: str, known: Collection[str] = (), *, note: str = "") -> dict[str, Any]:
    """A policy's config entry as a fresh dict, every field in ``known`` (none: the policy takes no fields)."""
    cfg = parse_config_object(raw, path)
    check_fields(cfg, path, known, owner=owner, note=note)
    return cfg
