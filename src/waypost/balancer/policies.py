"""The registry of load-balancing policy names -> Policy classes.

Importing this module registers every built-in policy.
"""

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


def _register_builtins() -> None:
    # The policy modules import only .base, so there is no import cycle with this module.
    from .consistent_hash import ConsistentHashPolicy
    from .least_request import LeastRequestPolicy
    from .outlier_detection import OutlierDetectionPolicy
    from .p2c_ewma import P2CEwmaPolicy
    from .peak_ewma import PeakEwmaPolicy
    from .pick_first import PickFirstPolicy
    from .random_pick import RandomPolicy
    from .round_robin import RoundRobinPolicy
    from .weighted_round_robin import WeightedRoundRobinPolicy

    for cls in (
        PickFirstPolicy,
        RoundRobinPolicy,
        RandomPolicy,
        WeightedRoundRobinPolicy,
        P2CEwmaPolicy,
        PeakEwmaPolicy,
        LeastRequestPolicy,
        ConsistentHashPolicy,
        OutlierDetectionPolicy,
    ):
        register_policy(cls)


_register_builtins()
