"""Several sources as one target (``dial([target1, target2])``): the union of their backends.

For registries that back each other up ("双注册中心互为备份": two registries, each holding every
registration): a client reads both, so when one is down or lost its data, the other's list still names every
backend. Each source is its own resolver (etcd, Consul, ZooKeeper, k8s, dns, direct), started in the
background:

- the channel gets the union of the sources' latest lists; an address in several sources is one backend (the
  metadata of the first source in the target's order that lists it);
- a source that cannot be read keeps its last list (every resolver does), so its backends stay in the union
  until the source answers again with something else; its errors reach the channel prefixed with the source;
- subsetting applies to the union (the sources are read whole).

A blocking start (sync dial) returns as soon as one source has answered; it fails only when no source
answered within ``timeout``, naming each source's error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace

from ..errors import RegistryUnavailable
from ..types import Backend
from .base import OnError, OnUpdate, Resolver, ResolverOptions
from .target import Target

log = logging.getLogger("waypost.resolver.multi")


class MultiResolver:
    """The union of ``target.sources`` (see the module docstring)."""

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0) -> None:
        from . import make_resolver

        if target.scheme != "multi" or len(target.sources) < 2:
            raise ValueError(f"not a multi-source target: {target.redacted}")
        options = options if options is not None else ResolverOptions()
        self.target = target
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.timeout = timeout
        # every source in the background: one unreachable source must not hold the others up
        child = replace(options, subsetter=None, blocking=False)
        self.sources: list[Resolver] = [make_resolver(t, child) for t in target.sources]
        self._lists: list[Sequence[Backend] | None] = [None] * len(self.sources)
        self._errors: list[str] = [""] * len(self.sources)
        self._lock = threading.Lock()
        self._first = threading.Event()
        self._last: tuple[Backend, ...] | None = None
        self._on_update: OnUpdate | None = None
        self._on_error: OnError | None = None

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        self._on_update, self._on_error = on_update, on_error
        for i, r in enumerate(self.sources):
            r.start(*self._callbacks(i))
        if self.blocking and not self._first.wait(self.timeout):
            self.close()
            why = "; ".join(f"{t.redacted}: {e or 'no answer'}" for t, e in zip(self.target.sources, self._errors))
            raise RegistryUnavailable(f"no source of {self.target.redacted} answered within {self.timeout:g}s ({why})")

    def _callbacks(self, i: int) -> tuple[OnUpdate, OnError]:
        def on_update(backends: Sequence[Backend]) -> None:
            self._update(i, backends)

        def on_error(message: str) -> None:
            self._error(i, message)

        return on_update, on_error

    def _update(self, i: int, backends: Sequence[Backend]) -> None:
        with self._lock:
            self._lists[i] = list(backends)
            self._errors[i] = ""
            merged: dict[str, Backend] = {}
            for lst in self._lists:
                for b in lst or ():
                    merged.setdefault(b.address, b)
            union = tuple(merged.values())
            if union == self._last and self._first.is_set():
                return
            self._last = union
            out: Sequence[Backend] = list(union)
            if self.subsetter is not None:
                out = self.subsetter.select(out)
            assert self._on_update is not None
            self._on_update(out)  # under the lock: the channel sees the unions in order
        self._first.set()

    def _error(self, i: int, message: str) -> None:
        with self._lock:
            self._errors[i] = message
        log.debug("waypost: source %s of %s: %s", self.target.sources[i].redacted, self.target.redacted, message)
        if self._on_error is not None:
            self._on_error(f"{self.target.sources[i].redacted}: {message}")

    def resolve_now(self, reason: str) -> None:
        for r in self.sources:
            r.resolve_now(reason)

    def source_lists(self) -> list[list[str] | None]:
        """Each source's latest addresses (None: no answer yet), in the target's order (introspection)."""
        with self._lock:
            return [None if lst is None else [b.address for b in lst] for lst in self._lists]

    def close(self) -> None:
        for r in self.sources:
            try:
                r.close()
            except Exception:  # closing one source must not leave the others open
                log.exception("waypost: closing a source of %s", self.target.redacted)

    async def aclose(self) -> None:
        for r in self.sources:
            try:
                await r.aclose()
            except Exception:
                log.exception("waypost: closing a source of %s", self.target.redacted)


__all__ = ["MultiResolver"]
