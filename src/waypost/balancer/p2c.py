"""The random draws of the power-of-choices policies (peak_ewma, p2c_ewma, least_request, prequal's fallback).

``pair`` is the P2C draw of tower's ``balance::p2c`` (and Finagle's): two *distinct* indices, the first uniform
over ``n``, the second uniform over the other ``n - 1`` (a draw below ``n - 1`` moved past the first). Two rng
calls a pair, in that order, so a seeded rng gives the same picks wherever a policy draws through here.

``distinct`` is peak_ewma's best-of-k draw: ``count`` distinct indices, uniformly (``rng.sample``), first drawn
first.

``choices`` is gRPC A48's draw for ``least_request``: ``count`` indices *with* replacement, one rng call each
(grpc-go draws the same way; with replacement a pick of ``choiceCount`` can hold one backend twice, which A48
accepts as the price of not tracking what was drawn).

``WeightedDraw`` is the draw of these policies when the registered weights differ (weighted P2C): each candidate
drawn independently, index ``i`` with probability ``weights[i] / total`` (one ``rng.randrange(total)`` a draw,
integer arithmetic, so a seeded rng gives the same draws everywhere). Drawn *with replacement*: a comparison that
favours neither of two equally loaded candidates then picks each backend with probability exactly its weight
share (``p^2 + p(1 - p)``: both draws, or one of two and half the ties), which is what a weight means when the
fleet is idle; a distinct pair cannot give that (with two backends every pick would be the comparison's).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidServiceConfig

__all__ = ["WeightedDraw", "choices", "distinct", "pair", "parse_choice_count"]

MIN_CHOICE_COUNT = 2
MAX_CHOICE_COUNT = 10


def parse_choice_count(cfg: dict[str, Any], path: str) -> None:
    """Check ``cfg``'s ``choiceCount`` when present (an integer, 3.0 taken as 3), in place."""
    if "choiceCount" in cfg:
        count = cfg["choiceCount"]
        if isinstance(count, float) and count.is_integer():
            count = cfg["choiceCount"] = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or not MIN_CHOICE_COUNT <= count <= MAX_CHOICE_COUNT:
            raise InvalidServiceConfig(f"{path}.choiceCount: expected an integer from {MIN_CHOICE_COUNT} to "
                                       f"{MAX_CHOICE_COUNT} (backends compared per pick), got {count!r}")


def pair(rng: random.Random, n: int) -> tuple[int, int]:
    """Two distinct indices below ``n`` (``n >= 2``), uniformly among all ordered pairs."""
    a = rng.randrange(n)
    b = rng.randrange(n - 1)
    if b >= a:
        b += 1
    return a, b


def distinct(rng: random.Random, n: int, count: int) -> list[int]:
    """``min(count, n)`` distinct indices below ``n``, uniformly among all ordered selections, in draw order."""
    return rng.sample(range(n), min(count, n))


def choices(rng: random.Random, n: int, count: int) -> list[int]:
    """``count`` indices below ``n`` (``n >= 1``), drawn independently (with replacement), in draw order."""
    return [rng.randrange(n) for _ in range(count)]


class WeightedDraw:
    """Indices drawn in proportion to positive integer ``weights`` (see the module doc); immutable, shared by the
    picks of one picker."""

    __slots__ = ("_ends", "_starts", "total")

    def __init__(self, weights: Sequence[int]) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError(f"weighted draw: weights must be positive integers, got {list(weights)}")
        ends: list[int] = []
        total = 0
        for w in weights:
            total += w
            ends.append(total)
        self._ends = tuple(ends)  # index i owns the integers [ends[i] - weights[i], ends[i])
        self._starts = (0, *ends[:-1])
        self.total = total

    def __len__(self) -> int:
        return len(self._ends)

    def draw(self, rng: random.Random) -> int:
        """One index, ``i`` with probability ``weights[i] / total``."""
        return bisect.bisect_right(self._ends, rng.randrange(self.total))

    def pair(self, rng: random.Random) -> tuple[int, int]:
        """Two independent draws (the same index possibly twice), in draw order."""
        return self.draw(rng), self.draw(rng)

    def choices(self, rng: random.Random, count: int) -> list[int]:
        """``count`` independent draws, in draw order."""
        return [self.draw(rng) for _ in range(count)]

    def other(self, rng: random.Random, i: int) -> int:
        """An index other than ``i``, in proportion to the weights of the others (``len(self) >= 2``): the draw of a
        second candidate when ``i`` must be compared with someone."""
        start, end = self._starts[i], self._ends[i]
        r = rng.randrange(self.total - (end - start))
        return bisect.bisect_right(self._ends, r if r < start else r + (end - start))


#: how sharply ``prefer`` follows a difference of load (see there)
SHARPNESS = 4


def prefer(rng: random.Random, first: float, second: float) -> bool:
    """Whether weighted P2C takes the ``second`` candidate over the ``first``, given their loads: with probability
    ``first^k / (first^k + second^k)`` (``k = SHARPNESS``), one ``rng.random()`` (none when a load is 0 or both
    are equal: the lower one, or on a tie the first drawn)."""
    if first == second or first == 0.0 or second == 0.0:
        return second < first
    a, b = first**SHARPNESS, second**SHARPNESS
    return rng.random() * (a + b) < a
