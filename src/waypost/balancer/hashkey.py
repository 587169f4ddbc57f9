"""The consistent-hash key of the calls made in the current context.

``with waypost.hash_key(user_id): stub.Call(req)`` sets a ``contextvars.ContextVar``, so the key
follows the code that set it: per thread for sync channels, per task for asyncio (a task copies the
context of its creator when it is created). The channel reads it with ``current_hash_key()``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_HASH_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("waypost_hash_key", default=None)


def normalize_hash_key(key: str | bytes | int | None) -> str | None:
    """The key as a str: ints and other values through ``str()``; bytes are kept byte-exact by
    decoding with ``surrogateescape`` (``key_bytes`` turns it back into the very same bytes)."""
    if key is None:
        return None
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "surrogateescape")
    if isinstance(key, bool):
        raise TypeError("hash key must be str, bytes or int, not bool")
    if isinstance(key, int):
        return str(key)
    raise TypeError(f"hash key must be str, bytes or int, not {type(key).__name__}")


def key_bytes(key: str) -> bytes:
    """The bytes hashed for ``key`` (UTF-8; bytes keys round-trip exactly)."""
    return key.encode("utf-8", "surrogateescape")


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
