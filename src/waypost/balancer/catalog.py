"""The table of load-balancing policy names -> Policy classes, and the one ``loadBalancingConfig`` reader.

It sits below the policies so that a policy which wraps another (outlier_detection's ``childPolicy``)
can look its child up by name without importing ``policies``, which imports every built-in policy:
that import went both ways before. ``policies`` fills this table with the built-ins when it is
imported; import names from ``policies``, which guarantees they are registered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn, TypeVar

from ..errors import InvalidServiceConfig, describe_value
from .base import Policy

log = logging.getLogger("waypost.balancer.catalog")

POLICIES: dict[str, type[Policy]] = {}
_BUILTIN: set[str] = set()  # names the library registered itself (``policies``): never replaced

P = TypeVar("P", bound=type[Policy])


def register_policy(cls: P) -> P:
    """Make a policy available by its ``name`` in service configs and ``dial(balancer=...)``; usable as a class
    decorator (it returns ``cls``).

    Registering the same class again does nothing; another class under a name registered before replaces it (a
    WARNING says so), except a built-in policy's name, which is refused: pick a name of your own.
    Raises TypeError when ``cls`` is not a ``waypost.Policy`` subclass and ValueError when its ``name`` is
    missing, not a non-empty string, or a built-in's.
    """
    if not isinstance(cls, type) or not issubclass(cls, Policy):
        raise TypeError(f"register_policy: expected a subclass of waypost.Policy, got {describe_value(cls)}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_policy: {cls.__qualname__} needs a class attribute `name` (a non-empty "
                         f"string: the key used in loadBalancingConfig), got {describe_value(name)}")
    existing = POLICIES.get(name)
    if existing is cls:
        return cls
    if name in _BUILTIN:
        raise ValueError(f"register_policy: {name!r} is a built-in policy ({existing.__qualname__ if existing else ''}); "
                         f"give {cls.__qualname__} a name of its own (e.g. 'my_{name}')")
    if existing is not None:
        log.warning("register_policy: %r was %s, now %s", name, existing.__qualname__, cls.__qualname__)
    POLICIES[name] = cls
    return cls


def register_builtin(cls: type[Policy]) -> None:
    """Register one of the library's own policies (``policies`` does, on import); its name is then reserved."""
    register_policy(cls)
    _BUILTIN.add(cls.name)


def known_policies() -> list[str]:
    return sorted(POLICIES)


def get_policy(name: str) -> type[Policy]:
    """The Policy class for ``name``; KeyError when unknown."""
    return POLICIES[name]


def known_policies_text() -> str:
    """The registered names for an error message."""
    return ", ".join(known_policies()) or "(none registered)"


class PolicyChoice(NamedTuple):
    """The policy a ``loadBalancingConfig`` list selects, with its validated config and JSON path."""

    name: str
    config: dict[str, Any]
    path: str


def parse_policy_config(name: str, config: object, path: str) -> dict[str, Any]:
    """``config`` validated by the registered policy ``name``; InvalidServiceConfig naming ``path``."""
    try:
        parsed = POLICIES[name].parse_config(config, path)
    except InvalidServiceConfig:
        raise
    except (TypeError, ValueError) as exc:  # a policy's own conversion failing is still a config error
        raise InvalidServiceConfig(f"{path}: invalid config for policy {name!r}: {exc}") from None
    return dict(parsed)


def parse_lb_config_list(value: object, path: str) -> PolicyChoice:
    """Read a ``loadBalancingConfig`` list as gRPC does: single-key ``{policy_name: config}`` objects,
    the first registered policy wins, unknown names before it are skipped (with a warning).

    Raises InvalidServiceConfig naming ``path`` when the list is malformed or names no known policy.
    """
    if not isinstance(value, list):
        _fail(path, f"expected a list of {{policy_name: config}} objects, got {describe_value(value)}")
    if not value:
        _fail(path, f"expected at least one policy; known policies: {known_policies_text()}")
    skipped: list[str] = []
    for i, entry in enumerate(value):
        entry_path = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            _fail(entry_path, f"expected an object with one key (the policy name), got {describe_value(entry)}")
        if len(entry) != 1:
            _fail(entry_path, f"expected exactly one key (the policy name), got {len(entry)}: {sorted(entry)}")
        ((name, config),) = entry.items()
        if name in POLICIES:
            if skipped:
                log.warning("%s: skipped unknown policies %s, using %r", path, skipped, name)
            return PolicyChoice(name, parse_policy_config(name, config, f"{entry_path}.{name}"), entry_path)
        skipped.append(name)
    _fail(path, f"none of the policies {skipped} is known; known policies: {known_policies_text()}")


def _fail(path: str, message: str) -> NoReturn:
    raise InvalidServiceConfig(f"{path}: {message}")
