"""The built-in load-balancing policies, registered by name in ``catalog`` when this module is imported.

Look policies up through this module (``get_policy``, ``known_policies``, ``register_policy``,
``POLICIES``, defined in ``catalog``): importing it guarantees the built-ins are registered. The
policy modules themselves import only ``base``/``catalog``/``stats``, never this module, so the
imports run one way.
"""

from __future__ import annotations

from .catalog import POLICIES, get_policy, known_policies, register_builtin, register_policy
from .consistent_hash import ConsistentHashPolicy
from .least_request import LeastRequestPolicy
from .outlier_detection import OutlierDetectionPolicy
from .p2c_ewma import P2CEwmaPolicy
from .peak_ewma import PeakEwmaPolicy
from .pick_first import PickFirstPolicy
from .prequal import PrequalPolicy
from .random_pick import RandomPolicy
from .round_robin import RoundRobinPolicy
from .smooth_weighted_round_robin import SmoothWeightedRoundRobinPolicy
from .weighted_random import WeightedRandomPolicy
from .weighted_round_robin import OrcaWeightedRoundRobinPolicy

__all__ = ["BUILTIN_POLICIES", "POLICIES", "get_policy", "known_policies", "register_policy"]

BUILTIN_POLICIES = (
    PickFirstPolicy,
    RoundRobinPolicy,
    RandomPolicy,
    SmoothWeightedRoundRobinPolicy,
    OrcaWeightedRoundRobinPolicy,
    WeightedRandomPolicy,
    P2CEwmaPolicy,
    PeakEwmaPolicy,
    PrequalPolicy,
    LeastRequestPolicy,
    ConsistentHashPolicy,
    OutlierDetectionPolicy,
)

for _cls in BUILTIN_POLICIES:
    register_builtin(_cls)
