"""Holding an empty answer that may be a registry's passing state, not the truth.

A registry back from an outage (or restarted empty) can answer "no instance" for a moment although none is gone:
its instances come back as their owners reach it again (a TTL check passed, a heartbeat answered 404 and the
instance registered again). A resolver that applied that answer would leave every client without a backend
meanwhile. ``EmptyListHold`` is the rule a resolver applies to such an answer: when it would empty a list that had
entries, and the moment is one where that can happen (``may_start``: the resolver says when), the last list is
kept until the answer has stayed empty for ``settle`` s; any non-empty answer ends the hold at once.
"""

from __future__ import annotations

from collections.abc import Callable


class EmptyListHold:
    """The hold of one resolver (``settle`` s; ``clock``: the resolver's). ``on_start()`` runs when a hold
    starts, ``on_expired(seconds)`` when the empty answer is applied after holding it (both log it)."""

    def __init__(self, settle: float, clock: Callable[[], float], *, on_start: Callable[[], None],
                 on_expired: Callable[[float], None]) -> None:
        self.settle = settle
        self._clock = clock
        self._on_start = on_start
        self._on_expired = on_expired
        #: clock time the empty answer has been held since (None: no hold)
        self.since: float | None = None
        #: holds started so far (introspection and tests)
        self.holds = 0

    def hold(self, empties_list: bool, may_start: bool) -> bool:
        """Whether to keep the last list instead of this answer. ``empties_list``: the answer is empty and the
        last list was not; ``may_start``: a hold may start now (one that runs goes on regardless)."""
        if not empties_list:
            self.since = None
            return False
        now = self._clock()
        if self.since is None:
            if not may_start:
                return False
            self.since = now
            self.holds += 1
            self._on_start()
            return True
        if now - self.since < self.settle:
            return True
        self._on_expired(now - self.since)
        self.since = None
        return False
