"""Why a registry target has no backend at all: nothing is registered under its key.

A misspelt key (``inventry.rpc``) resolves to an empty list, not to an error: the registry cannot tell a
service with no instance from one that never existed. When the resolver reports an empty list, the balancer
wrapper puts ``EmptyKey.note()`` into the error details of the calls that fail (``nothing is registered under
key 'inventry.rpc'``), and starts ``look_up`` once: one bounded read of the registry's keys (keys only, at
most ``LIST_LIMIT``, within ``LOOKUP_TIMEOUT``) on the control loop, after which the note names the registered
keys closest to it (``difflib.get_close_matches``). The calls that find no backend while that read runs wait for
it (until ``due``, or their own deadline), so that even the first call after the dial says ``did you mean
'inventory.rpc'?``. Nothing here runs per call: the note is computed when the list changes and published with the
picker.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from collections.abc import Callable, Iterable

from .. import _loop
from ..resolver.target import Target

log = logging.getLogger("waypost.client")

#: at most this many keys are read from the registry to find close ones
LIST_LIMIT = 10_000
#: how long that read may take: the longest a failing call waits for the close keys (a keys-only read of a
#: registry that has just answered the resolver's read: milliseconds, unless it is overloaded)
LOOKUP_TIMEOUT = 1.0
#: how many close keys a note names
MAX_CLOSE = 3
#: key prefixes of waypost's own records, never suggested
_PRIVATE = ("_waypost/",)


def close_keys(key: str, registered: Iterable[str], n: int = MAX_CLOSE) -> list[str]:
    """The service keys among ``registered`` (registry keys such as ``inventory.rpc/7587...``: every prefix
    before a ``/``, and keys without one) closest to ``key``, best first."""
    candidates: set[str] = set()
    for k in registered:
        if k.startswith(_PRIVATE):
            continue
        parts = k.split("/")
        candidates.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if len(parts) == 1:
            candidates.add(k)
    candidates.discard("")
    candidates.discard(key)
    return difflib.get_close_matches(key, sorted(candidates), n=n, cutoff=0.6)


class EmptyKey:
    """The note for one channel's registry target whose list is empty (see the module docstring)."""

    def __init__(self, target: Target, deliver: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.target = target
        self.key = target.key or ""
        #: the close keys once looked up (None: not yet)
        self.close: list[str] | None = None
        #: time.monotonic() by which the running look-up ends (None: none runs); calls wait for it until then
        self.due: float | None = None
        #: runs the end of a look-up's ``done`` where the channel's updates run (an aio channel: its loop)
        self._deliver = deliver

    @classmethod
    def for_target(cls, target: Target, deliver: Callable[[Callable[[], None]], None] | None = None
                   ) -> EmptyKey | None:
        """None for targets without a registry key (direct, DNS, k8s, ...). ``deliver(fn)``: run ``fn`` where the
        channel's updates run (default: at once, on the control loop)."""
        return cls(target, deliver) if target.uses_registry and target.key else None

    def note(self) -> str:
        close = ""
        if self.close:
            close = f"; did you mean {' or '.join(repr(k) for k in self.close)}?"
        return (f"nothing is registered under key {self.key!r}{close} (`waypost ls` lists the registered keys; "
                "a server registers with waypost.serve(server, key, ...))")

    def look_up(self, done: Callable[[], None]) -> None:
        """Read the registry's keys once, in the background; ``done()`` once the read ended (``close`` known, or
        the read failed: then it is tried again on the next empty list)."""
        if self.close is not None or self.due is not None:
            return
        self.due = time.monotonic() + LOOKUP_TIMEOUT
        _loop.submit(self._read(done))

    async def _read(self, done: Callable[[], None]) -> None:
        from ..discovery.connections import connect

        try:
            reg = connect(self.target.registry_url())
            res = await asyncio.wait_for(reg.get("", prefix=True, keys_only=True, limit=LIST_LIMIT), LOOKUP_TIMEOUT)
            self.close = close_keys(self.key, (kv.key for kv in res.kvs))
        except Exception as e:  # noqa: BLE001 -- a hint only: the note without close keys stays
            log.debug("waypost: %s: listing keys for a hint failed: %s", self.target.redacted, e)
        finally:
            self.due = None
        if self._deliver is None:
            done()
            return
        try:
            self._deliver(done)
        except RuntimeError:  # the channel's event loop is closed: no call is left to tell
            log.debug("waypost: %s: the close keys arrived after the channel's loop closed", self.target.redacted)
