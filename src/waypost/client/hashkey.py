"""The consistent-hash key of the calls made in the current context.

``with waypost.hash_key(user_id): stub.Call(req)`` sets a ``contextvars.ContextVar``, so the key
follows the code that set it: per thread for sync channels, per task for asyncio (a task copies the
context of its creator when it is created). Read it with ``current_hash_key()``; the call path reads
``HASH_KEY`` itself (``client.method``: a ``ContextVar.get`` costs no Python frame).

Why here, in the client core: the key is per-call context, set by users and read by the multicallables at
pick time (``client.method``), which hand it to the picker as ``PickInfo.hash_key``. Policies never
read the context variable; they only see ``PickInfo``. What the key's text means (``normalize_hash_key``,
``key_bytes``) is part of that picker contract, so it lives with ``PickInfo`` in ``balancer.base``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from ..balancer.base import normalize_hash_key

#: The key of the current context (None: no key). Set it with ``hash_key``.
HASH_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("waypost_hash_key", default=None)


@contextmanager
def hash_key(key: str | bytes | int | None) -> Iterator[None]:
    """Use ``key`` as the consistent-hash key of the calls made inside this block (None clears it)."""
    token = HASH_KEY.set(normalize_hash_key(key))
    try:
        yield
    finally:
        HASH_KEY.reset(token)


def current_hash_key() -> str | None:
    """The hash key set by the innermost enclosing ``hash_key(...)`` block, or None."""
    return HASH_KEY.get()
