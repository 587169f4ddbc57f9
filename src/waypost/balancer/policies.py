"""The registry of load-balancing policy names -> Policy classes."""

from __future__ import annotations

from .base import Policy

POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name`` in service configs."""
    POLICIES[cls.name] = cls
    return cls


def known_policies() -> list[str]:
    return sorted(POLICIES)


def get_policy(name: str) -> type[Policy]:
    """The Policy class for ``name``; KeyError when unknown."""
    return POLICIES[name]
