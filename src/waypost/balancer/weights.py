"""What a registration's ``weight`` means: the one place that decides, for every weight-aware policy.

A backend's weight is its registration metadata ``weight`` (an int, an integral float or a numeric
string; go-zero and Kratos metadata carry strings):

- missing: ``DEFAULT_WEIGHT`` (100), so unweighted backends share traffic equally;
- a positive integer: that weight;
- ``0``: **drained**. The backend stays registered (and connected) but is never picked while any
  backend has a positive weight; when every backend is drained a pick fails with UNAVAILABLE naming
  the cause (``all_drained``). Setting weight 0 is how an operator takes traffic off an instance
  without deregistering it, so the zero must never be "corrected" into a default: that would send the
  drained instance the bulk of the traffic;
- negative: a mistake in the registration, logged and treated as drained (0): whoever wrote it meant
  "less", never "the default";
- anything else (not a number, a fraction, a bool, infinity): unparsable, logged and replaced by
  ``DEFAULT_WEIGHT`` (nothing says what was meant, so the backend is treated like an unweighted one).

Policies call ``weight_of`` once per distinct metadata value and log the returned problem, so a bad
weight is reported once per backend and not on every rebuild.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, Generic, TypeVar

import grpc

from ..errors import NoBackendAvailable
from ..types import Backend
from .base import Picker, PickError
from .p2c import WeightedDraw
from .stats import dedupe

__all__ = ["DEFAULT_WEIGHT", "DRAINED", "Capacity", "CapacityMemo", "CapacityPicker", "all_drained", "no_backend",
           "parse_weight", "weight_of"]

P = TypeVar("P")
S = TypeVar("S")

#: the weight of a backend whose registration carries no (or an unparsable) ``weight``
DEFAULT_WEIGHT = 100
#: the weight of a drained backend: registered, never picked while another backend has a positive weight
DRAINED = 0


class _Negative(ValueError):
    """A parsable but negative weight (``weight_of`` drains it instead of defaulting it)."""


def parse_weight(metadata: Mapping[str, Any]) -> int | None:
    """The ``weight`` in ``metadata`` as an int (0 or more); None when absent.

    Raises ValueError for a value that is not an integer, and for a negative one (the message says
    which); ``weight_of`` turns both into a weight.
    """
    if "weight" not in metadata:
        return None
    raw = metadata["weight"]
    value: float = math.nan  # bools and other types stay NaN: "not a number"
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, (str, bytes)):
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        with suppress(ValueError):
            value = float(text.strip())
    if math.isnan(value):
        raise ValueError(f"weight {raw!r} is not a number")
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"weight {raw!r} is not an integer")
    if value < 0:
        raise _Negative(f"weight {raw!r} is negative")
    return int(value)


def weight_of(metadata: Mapping[str, Any]) -> tuple[int, str | None]:
    """``(weight, problem)`` for a registration's metadata: the weight a policy uses (``DRAINED`` for a
    drained backend) and, for a bad value, a sentence for the log saying what was wrong and what is used."""
    try:
        weight = parse_weight(metadata)
    except _Negative as exc:
        return DRAINED, f"{exc}; treating the backend as drained (weight 0: no traffic)"
    except ValueError as exc:
        return DEFAULT_WEIGHT, (f"{exc}; using the default weight {DEFAULT_WEIGHT} "
                                "(register an integer: 0 drains the backend, more than 0 weighs it)")
    return (DEFAULT_WEIGHT if weight is None else weight), None


def all_drained(policy: str, count: int) -> PickError:
    """The pick error when every READY backend is drained: UNAVAILABLE, saying why and what to do."""
    return PickError(
        grpc.StatusCode.UNAVAILABLE,
        f"{policy}: every backend has weight 0 (all {count} READY backends are drained); "
        "register a backend with a positive metadata weight to send it traffic",
    )


def no_backend(policy: str, drained: int) -> Exception:
    """The pick error of an empty picker: ``all_drained`` when ``drained`` backends were left out, else
    NoBackendAvailable."""
    return all_drained(policy, drained) if drained else NoBackendAvailable(f"{policy}: no READY backend")


class WeightMemo:
    """The weights of the current backends, each parsed (and its problem logged on ``log``) once per distinct
    metadata value: a rebuild with unchanged metadata neither re-parses nor logs again."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._weights: dict[str, tuple[object, int]] = {}  # address -> (metadata weight, weight used)

    def update(self, backends: Sequence[Backend]) -> dict[str, int]:
        """address -> weight used, for ``backends`` (addresses no longer there are forgotten)."""
        known, self._weights = self._weights, {}
        for b in backends:
            raw = b.metadata.get("weight")
            entry = known.get(b.address)
            if entry is None or entry[0] != raw:
                weight, problem = weight_of(b.metadata)
                if problem is not None:
                    self._log.warning("backend %s: %s", b.address, problem)
                entry = (raw, weight)
            self._weights[b.address] = entry
        return self.current()

    def current(self) -> dict[str, int]:
        return {a: w for a, (_, w) in self._weights.items()}


class Capacity:
    """What the load-aware policies (peak_ewma, p2c_ewma, least_request, prequal) make of the weights of one build.

    A registered weight is a capacity statement, honoured by **weighted P2C** whenever the weights differ:

    - the candidates of a pick are drawn in proportion to weight, with replacement (``p2c.WeightedDraw``);
    - they are compared on their load *per unit of capacity*: a backend's calls in flight are divided by its
      ``units`` (its weight over the mean weight of the build: an average backend is one unit), its latency is not
      (peak_ewma: ``latency x (in flight / units + 1)``; p2c_ewma: ``sqrt(lag + 1) x (in flight / units + 1)``;
      least_request: ``in flight / weight``, the first drawn on ties; prequal: the RIF its probes report, per unit),
      latencies smoothly (``p2c.prefer``: a hair's difference is a coin toss, twice the load loses 16 times in 17);
    - a backend drawn twice is picked without a comparison, unless the policy counts it as failing (peak_ewma: a
      call failed there within ``decayTime``; p2c_ewma: its success EWMA is at or below half): it is then compared
      with a second candidate drawn, by weight, from the others.

    Why: when the fleet is idle (nothing in flight, equal latency) the comparison favours neither candidate, so each
    backend gets exactly its weight's share of the calls (``p^2 + p(1 - p) = p``: the share a user who registers
    100:10 expects, as Envoy's weighted least request and gRPC's weighted round robin give); as calls pile up, the
    queue per unit of capacity decides, so at equal latency the in-flight counts, hence the traffic, follow the
    weights; and a slow backend loses the comparisons it is drawn into, whatever its weight. Dividing a backend's
    whole load by its weight instead (what these policies did before) made the heavier backend of every pair win
    when nothing is in flight: 100:10 sent 99.9 % of sequential calls to the heavy one. The price of the draw: a
    healthy backend of share ``p`` keeps at least ``p^2`` of the picks however slow it is (it is drawn twice that
    often), as under Envoy's rule, where it keeps ``p``.

    Drained backends (weight 0) are left out of the picker while any backend has a positive weight, as in the
    weighted policies.

    ``backends``: the ones to pick among; ``weights``: each one's weight, None when all weights are equal (the
    policy then draws and compares exactly as without weights: an unweighted fleet is balanced pick for pick as
    before); ``units``: each one's weight / the mean weight (None with ``weights``); ``draws``: the weighted draw
    over them (None with ``weights``); ``drained``: how many were left out (a picker with no backend and
    ``drained`` > 0 raises ``all_drained``).
    """

    __slots__ = ("backends", "drained", "draws", "units", "weights")

    def __init__(self, backends: list[Backend], weights: tuple[int, ...] | None, drained: int) -> None:
        self.backends = backends
        self.weights = weights
        self.drained = drained
        self.units: tuple[float, ...] | None = None
        self.draws: WeightedDraw | None = None
        if weights is not None:
            self.units = tuple(w * len(weights) / sum(weights) for w in weights)
            self.draws = WeightedDraw(weights)


class CapacityMemo:
    """``Capacity`` per build, each weight parsed (and a bad one logged) once per distinct metadata value."""

    def __init__(self, log: logging.Logger) -> None:
        self._memo = WeightMemo(log)

    def split(self, backends: Sequence[Backend]) -> Capacity:
        """``backends`` (duplicate addresses dropped) split by their weights."""
        backends = dedupe(backends)
        weights = self._memo.update(backends)
        kept = [b for b in backends if weights[b.address] > DRAINED]
        used = tuple(weights[b.address] for b in kept)
        return Capacity(kept, used if len(set(used)) > 1 else None, len(backends) - len(kept))


class CapacityPicker(Picker, Generic[P, S]):
    """What the pickers of the load-aware policies hold: their policy, the backends one ``Capacity`` kept, each
    one's per-backend state (``stats``, index for index), the weights (``_weights``, ``_units``, ``_draws``; all
    None when the weights are equal: draw and compare as without weights) and how many backends were drained
    (``drained``: an empty picker with some raises ``all_drained``)."""

    def __init__(self, policy: P, capacity: Capacity, stats: Sequence[S]) -> None:
        self._policy = policy
        self._backends = tuple(capacity.backends)
        self._stats = tuple(stats)
        self._weights = capacity.weights
        self._units = capacity.units
        self._draws = capacity.draws
        self._drained = capacity.drained

    def capacities(self) -> dict[str, tuple[int, float]] | None:
        """address -> (weight, units) of the backends picked among; None when the weights are equal."""
        if self._weights is None or self._units is None:
            return None
        return {b.address: (w, u) for b, w, u in zip(self._backends, self._weights, self._units)}
