"""The consistent-hash key of the calls made in the current context.

``with waypost.hash_key(user_id): stub.Call(req)`` sets a ``contextvars.ContextVar``, so the key
follows the code that set it: per thread for sync channels, per task for asyncio (a task copies the
context of its creator when it is created). The channel reads it with ``current_hash_key()``.

Why here, in the client core: the key is per-call context, set by users and read by the channels at pick
time (``client.method``, ``channel``), which hand it to the picker as ``PickInfo.hash_key``. Policies never
read the context variable; they only see ``PickInfo``. What the key's text means (``normalize_hash_key``,
``key_bytes``) is part of that picker contract, so it lives with ``PickInfo`` in ``balancer.base``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from ..balancer.base import normalize_hash_key

_HASH_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("waypost_hash_key", default=None)


@contextmanager
def hash_key(key: str | bytes | int | None) -> Iterator[None]:
    """Use ``key`` as the consistent-hash key of the calls made inside this block (None clears it)."""
    token = _HASH_KEY.set(normalize_hash_key(key))
    try:
        yield
    finally:
        _HASH_KEY.reset(token)


def current_hash_key() -> str | None:
    """The hash key set by the innermost enclosing ``hash_key(...)`` block, or None."""
    return _HASH_KEY.get()
