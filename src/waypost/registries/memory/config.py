"""memory URLs and targets: ``memory://NAME`` (``waypost.connect``; no name: ``default``) and
``memory://NAME/?key=K[&format=F&exact=1]`` (a dial target)."""

from __future__ import annotations

from dataclasses import dataclass

from ...resolver.target import Target, fail
from ..etcd.target import key_param, keyed_options


@dataclass(frozen=True)
class MemoryURL:
    """A parsed ``memory://NAME`` URL: the name of a store of the process."""

    name: str
    scheme: str = "memory"

    @property
    def redacted(self) -> str:
        return f"memory://{self.name}"

    def cache_key(self) -> tuple[object, ...]:
        return (self.scheme, self.name)


def parse_memory_url(url: str) -> MemoryURL:
    """``memory://NAME`` (a path or query after the name is ignored)."""
    _, _, rest = url.strip().partition("://")
    return MemoryURL(rest.strip("/").partition("?")[0] or "default")


def parse_memory_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``memory://NAME/?key=K``: the store's name is the authority, the key a parameter."""
    if path not in ("", "/"):
        fail(scheme, raw, f"unexpected path {path!r}: the key goes in ?key=")
    key = key_param(params, scheme, raw)
    fmt, options = keyed_options(params, scheme, raw)
    return Target(scheme="memory", endpoints=(), key=key, format=fmt, options=options, raw=raw,
                  authority=authority)


def registry_url(target: Target) -> str:
    """The URL ``waypost.connect`` takes for a memory target's store."""
    return f"memory://{target.authority}"
