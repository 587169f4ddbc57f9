"""Key encoding and etcd's range rules.

Registry keys are ``str``; etcd keys are bytes. UTF-8 with ``surrogateescape`` round-trips any
byte string a foreign writer may have stored.
"""

from __future__ import annotations


def encode_key(key: str | bytes) -> bytes:
    """A registry key as etcd bytes (UTF-8, surrogateescape)."""
    if isinstance(key, bytes):
        return key
    return key.encode("utf-8", "surrogateescape")


def decode_key(key: bytes) -> str:
    """etcd key bytes as a registry key (undecodable bytes kept via surrogateescape)."""
    return key.decode("utf-8", "surrogateescape")


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes [prefix, range_end) cover exactly the keys starting with prefix.

    etcd's rule: increment the last byte that is below 0xff and drop what follows it; a prefix of
    only 0xff bytes (or empty) has no upper bound, spelled ``b"\\0"``.
    """
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


def key_range(key: str | bytes, prefix: bool) -> tuple[bytes, bytes]:
    """``(key, range_end)`` for a single key or a prefix; an empty prefix means every key."""
    k = encode_key(key)
    if not prefix:
        return k, b""
    if not k:
        return b"\0", b"\0"
    return k, prefix_range_end(k)
