"""What an export is, as plain data: ``Export`` and its traffic policy's parts (``Subset``, ``Split``, ``Fault``,
``Route``). ``exports.py`` parses and checks them, ``traffic.py``, ``routes.py`` and ``policy.py`` turn them into
resources; this module sits below all of them so that each names the real types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .matching import Match

if TYPE_CHECKING:
    from ..service_config.model import ServiceConfig


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


@dataclass(frozen=True)
class Subset:
    """Instances whose metadata has every (key, value) of ``selector``; an empty selector is filled from
    ``subset_key`` (the name is the value) when the export is checked."""

    name: str
    selector: tuple[tuple[str, str], ...] = ()

    def cluster(self, export_name: str) -> str:
        """The name of its Cluster (and ClusterLoadAssignment)."""
        return f"{export_name}/" + ",".join(f"{k}={v}" for k, v in self.selector)

    def selects(self, metadata: Mapping[str, Any]) -> bool:
        return all(_text(metadata.get(k)) == v for k, v in self.selector)


@dataclass(frozen=True)
class Split:
    """Where a route sends: subsets and their weights, sorted by name (equal configs, equal resources), and the
    targets given their own ``max_requests`` (``{v2 = {weight = 5, max_requests = 10}}``)."""

    weights: tuple[tuple[str, int], ...]
    limits: tuple[tuple[str, int], ...] = ()

    def limit(self, name: str) -> int | None:
        return dict(self.limits).get(name)


@dataclass(frozen=True)
class Fault:
    """gRFC A33's HTTPFault: a fixed delay and/or an abort with a gRPC status, each on a percentage of calls."""

    delay: float | None = None
    delay_percent: float = 100.0
    abort: int | None = None  # a gRPC status code number
    abort_percent: float = 100.0


@dataclass(frozen=True)
class Route:
    """One entry of ``routes``: what it matches (``matching.py``), where it sends (None: where the default route
    sends); ``max_requests``: its own circuit-breaking limit, on clusters of its own (``route_cluster``)."""

    match: Match = field(default_factory=Match)
    to: Split | None = None
    timeout: float | None = None
    fault: Fault | None = None
    max_requests: int | None = None


@dataclass(frozen=True)
class Export:
    """One exported service: its name, its source target(s) and the options (``exports.py``'s docstring)."""

    name: str
    target: str | tuple[str, ...]
    policy: str = "round_robin"
    policy_config: Mapping[str, Any] = field(default_factory=dict)
    hash_header: str | None = None
    prefer: tuple[str, str] | None = None  # ("zone" | "region", value)
    retries: int = 0
    retry_on: tuple[str, ...] = ("unavailable",)
    outlier_detection: Mapping[str, Any] | None = None
    serve_empty: bool = True
    service_config: ServiceConfig | None = None  # validated, methodConfig only
    # traffic policy (waypost.xds.traffic)
    subset_key: str | None = None
    subsets: tuple[Subset, ...] = ()  # resolved by make_export: every subset named anywhere, with its selector
    split: Split | None = None
    routes: tuple[Route, ...] = ()
    max_requests: int | None = None
    fault: Fault | None = None
    #: clients report load over LRS (``lrs.py``); None: not set (off, and ``--load-reporting`` turns it on)
    load_reporting: bool | None = None

    def __hash__(self) -> int:  # the mappings are never mutated; hash what identifies the export
        return hash((self.name, self.target))
