"""etcd / discov / memory targets: the backend list from a registry key, through ``waypost.Subscriber``.

The Subscriber keeps a local cache fed by a watch on the control loop; every change calls our listener
there, and the (subset) backend list goes to the channel. The registry connection is shared per endpoint
set by ``waypost.connect`` and is not closed here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

from ... import _loop
from ...backoff import Backoff
from ...errors import RegistryUnavailable
from ...resolver.base import OnError, OnUpdate, ResolverOptions
from ...resolver.target import Target
from ...types import Backend

log = logging.getLogger("waypost.resolver")

#: a background load still running after this many seconds asks the registry why (report_early)
DIAGNOSE_AFTER = 0.3
#: how long asking the registry why it is unreachable may take
PROBE_LIMIT = 2.0
#: the pause between attempts of a background load (each bounded by ``timeout`` itself, so the cap is lower than
#: the registry resolvers' reconnect pauses: a channel waiting for its first list is not kept waiting long)
OPEN_BACKOFF = Backoff(first=0.5, cap=5.0, jitter=0.0)

_INTERNAL_KEY = re.compile(r"'_waypost/[^']*'")
def _close_opened(opening: asyncio.Future[Any]) -> None:
    """The end of a subscriber's opening nobody waits for any more: close what it opened, and
    retrieve what it failed with (nothing to report: its resolver is gone)."""
    if opening.cancelled():
        return
    if opening.exception() is None:
        opening.result().close()


class RegistryResolver:
    """The backend list under a registry key; ``timeout`` bounds the initial load of a blocking start."""

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0) -> None:
        if not target.key:
            raise ValueError(f"registry target without a key: {target.redacted}")
        options = options if options is not None else ResolverOptions()
        self.key: str = target.key
        self.target = target
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.report_early = options.report_early
        self.quiet = options.quiet
        self.timeout = timeout
        self._sub: Any = None
        self._closed = False

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        """Blocking mode (sync dial): returns after the initial load, raising RegistryUnavailable when the
        registry cannot be read in time. Non-blocking mode (aio dial): loads in the background; calls wait
        for the first list meanwhile, and a failure is reported through ``on_error`` and retried."""
        from ...discovery import Subscriber

        if self.blocking:
            try:
                sub = Subscriber(self.target.registry_url(), self.key, exact=self.target.exact,
                                 format=self.target.format, timeout=self.timeout,
                                 cache_file=self.target.cache_file)
            except RegistryUnavailable as e:
                why = _loop.run(self._why_unreachable(), PROBE_LIMIT + 1)
                raise RegistryUnavailable(self._failure_text(e, why)) from e
            self._attach(sub, on_update)
            return
        _loop.submit(self._open_async(on_update, on_error))

    async def _why_unreachable(self) -> str | None:
        """The registry's own account of why it cannot be reached (bounded; None if it can or cannot say)."""
        from ...discovery.subscriber import resolve_registry

        try:
            return await asyncio.wait_for(resolve_registry(self.target.registry_url()).unreachable(), PROBE_LIMIT)
        except Exception:  # noqa: BLE001 -- a diagnosis only
            return None

    def _failure_text(self, e: BaseException, why: str | None) -> str:
        """Why the first read failed, cause first: the unreachable endpoints and why (``etcd at h:2379
        unreachable: connection refused``), then what could not be read; never waypost's internal keys."""
        what = f"could not read the key {self.key!r} within {self.timeout:g}s"
        if why is not None:
            return f"{why} ({what}; is etcd running there? `waypost etcd` starts one)"
        text = _INTERNAL_KEY.sub("its metadata records", str(e)) or type(e).__name__
        return text if text.startswith("could not read") else f"{what}: {text}"

    async def _open_async(self, on_update: OnUpdate, on_error: OnError) -> None:
        from ...discovery import Subscriber

        failures = 0
        while not self._closed:
            opening = asyncio.ensure_future(Subscriber.open(
                self.target.registry_url(), self.key, exact=self.target.exact, format=self.target.format,
                timeout=self.timeout, cache_file=self.target.cache_file))
            try:
                if self.report_early and not (await asyncio.wait({opening}, timeout=DIAGNOSE_AFTER))[0]:
                    why = await self._why_unreachable()  # the load goes on; calls can tell why they fail
                    if why is not None and not opening.done():
                        on_error(why)
                sub = await opening
            except asyncio.CancelledError:
                opening.cancel()  # the resolver is going: a subscriber opened meanwhile is closed at once
                opening.add_done_callback(_close_opened)
                raise
            except Exception as e:  # noqa: BLE001  # keep trying; calls see the reason meanwhile
                why = await self._why_unreachable()
                (log.debug if self.quiet else log.warning)("waypost: resolving %s failed: %s", self.target.redacted, e)
                on_error(self._failure_text(e, why))
                failures += 1
                await asyncio.sleep(OPEN_BACKOFF.delay(failures))
                continue
            if self._closed:
                sub.close()
                return
            self._attach(sub, on_update)
            return

    def _attach(self, sub: Any, on_update: OnUpdate) -> None:
        self._sub = sub

        def changed() -> None:
            if self._closed:
                return
            backends: Sequence[Backend] = sub.backends()
            if self.subsetter is not None:
                backends = self.subsetter.select(backends)
            log.debug("waypost: %s -> %d backends", self.target.redacted, len(backends))
            on_update(backends)

        sub.add_listener(changed)
        changed()
        # add_listener from another thread is applied on the control loop; re-read once it is attached so a
        # change landing in between is not missed (the loop runs callbacks in order).
        if not _loop.in_loop():
            _loop.call_soon(changed)

    def backends(self) -> Sequence[Backend]:
        return tuple(self._sub.backends()) if self._sub is not None else ()

    def resolve_now(self, reason: str) -> None:
        """Nothing to do: the registry watch already pushes every change."""

    def close(self) -> None:
        self._closed = True
        if self._sub is not None:
            self._sub.close()

    async def aclose(self) -> None:
        """close() without blocking an event loop."""
        self._closed = True
        if self._sub is not None:
            await self._sub.aclose()
