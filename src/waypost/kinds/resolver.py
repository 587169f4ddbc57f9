"""The resolver of every kind written against ``waypost.kinds``: one ``LoopResolver`` over any ``Discovery``.

What it adds to the loop (``waypost.resolver.loop_resolver``: the first list within the dial timeout, backoff,
the last list kept through an outage, one log line per new failure): the kind's ``Discovery`` is its session
(made from the target, closed with the resolver); each follow runs the discovery's ``watch`` and pushes every list
it yields (the discovery is made with the resolver, and given the dial's channel options, so a target or an
option the kind refuses fails the dial at once). ``InvalidTarget`` and ``PermissionDenied`` end a blocking dial at
once with an error (another read will not cure them), ``LookupFailed`` without one (it is the answer for now),
while the reads go on; ``resolve_now`` reaches the discovery (a polling one reads again soon).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable

from ..errors import InvalidTarget, PermissionDenied, RegistryUnavailable
from ..kind_table import RegistryKind, part
from ..resolver.base import ResolverOptions
from ..resolver.loop_resolver import START_GRACE, LoopResolver
from ..resolver.target import Target
from . import Discovery, LookupFailed

__all__ = ["KindResolver"]


class KindResolver(LoopResolver[Discovery]):
    """Follows ``target`` through ``kind``'s ``Discovery``. ``timeout`` bounds a blocking start (sync dial): the
    first list must come within it, else ``RegistryUnavailable`` names why. ``rng`` and ``clock`` are for tests."""

    def __init__(self, kind: RegistryKind, target: Target, options: ResolverOptions | None = None, *,
                 timeout: float = 5.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        service = target.key or (target.endpoints[0] if target.endpoints else "")
        if not service:
            raise InvalidTarget(f"{kind.title}: the target names no service: {target.redacted}")
        super().__init__(target, options, rng=rng, clock=clock)
        self.registry_kind = kind
        self.kind, self.noun, self.list_name = kind.scheme, kind.words.instances, kind.words.list_name
        self.log = logging.getLogger(f"waypost.resolver.{kind.scheme}")
        #: the service followed: the target's key (a target with none, e.g. DNS's: the name it resolves)
        self.service: str = service
        self.timeout = timeout
        self._answered = False  # a LookupFailed came: failures are answers, never held back
        # made here, so that a target, an option or a client library the kind refuses fails the dial itself
        self._discovery: Discovery = part(kind, "discovery")(target)
        self._discovery.dial_timeout = timeout
        self._discovery.configure(dict(options.channel_options) if options is not None else {})
        # one read is bounded by the dial's timeout too: a lookup given 1 s answers (naming why) within it
        self._discovery.read_timeout = min(self._discovery.read_timeout, timeout)
        if self._discovery.backoff is not None:
            self.backoff = self._discovery.backoff

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[Discovery]:
        try:
            yield self._discovery
        finally:
            await self._discovery.close()

    async def _follow(self, session: Discovery) -> None:
        async for backends in session.watch(self.service):
            if self._read_worked():
                self.log.info("waypost: %s: reading %s works again", self.kind, self._what())
            self._push(tuple(backends))

    def resolve_now(self, reason: str) -> None:
        self._discovery.resolve_now()

    def _failed(self, e: Exception) -> None:
        msg = self._describe(e)
        if isinstance(e, InvalidTarget | PermissionDenied):
            self._end_first_wait(e if isinstance(e, InvalidTarget) else RegistryUnavailable(msg))
        elif isinstance(e, LookupFailed):
            # an answer: the channel hears it at once (never held for the first list), then a blocking start
            # returns, the channel knowing why
            self._answered = True
            self._report(msg)
            self._end_first_wait()
            return
        self._report(msg)

    def _holding_errors(self) -> bool:
        return not self._answered and super()._holding_errors()

    @property
    def discovery(self) -> Discovery:
        """The kind's ``Discovery`` (introspection and tests)."""
        return self._discovery

    def _what(self) -> str:
        return self._discovery.describe(self.service)

    def _describe(self, e: Exception) -> str:
        if isinstance(e, InvalidTarget | PermissionDenied):
            return str(e)
        return self.registry_kind.words.read_failed.format(
            title=self.registry_kind.title, what=self._what(), error=str(e) or type(e).__name__)

    def _first_list_within(self) -> float:
        # past the first read's own bound, so that its failure (naming why) comes first
        return max(self.timeout, self._discovery.read_timeout + START_GRACE if self._discovery.read_timeout else 0)
