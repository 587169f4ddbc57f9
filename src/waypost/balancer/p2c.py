"""The random draws of the power-of-choices policies (peak_ewma, p2c_ewma, least_request, prequal's fallback).

``pair`` is the P2C draw of tower's ``balance::p2c`` (and Finagle's): two *distinct* indices, the first uniform
over ``n``, the second uniform over the other ``n - 1`` (a draw below ``n - 1`` moved past the first). Two rng
calls a pair, in that order, so a seeded rng gives the same picks wherever a policy draws through here.

``choices`` is gRPC A48's draw for ``least_request``: ``count`` indices *with* replacement, one rng call each
(grpc-go draws the same way; with replacement a pick of ``choiceCount`` can hold one backend twice, which A48
accepts as the price of not tracking what was drawn).
"""

from __future__ import annotations

import random

__all__ = ["choices", "pair"]


def pair(rng: random.Random, n: int) -> tuple[int, int]:
    """Two distinct indices below ``n`` (``n >= 2``), uniformly among all ordered pairs."""
    a = rng.randrange(n)
    b = rng.randrange(n - 1)
    if b >= a:
        b += 1
    return a, b


def choices(rng: random.Random, n: int, count: int) -> list[int]:
    """``count`` indices below ``n`` (``n >= 1``), drawn independently (with replacement), in draw order."""
    return [rng.randrange(n) for _ in range(count)]
