"""The sync client-streaming request replay: a request iterator that a later attempt can read again.

A retry of a client-streaming call must send the same requests again; they are recorded as the attempts
consume them, up to ``REPLAY_LIMIT`` (past it the call is committed to its attempt: no more retries). The
grpc.aio counterparts (an async iterator, the ``write()`` API) are in ``aio_replay``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

#: Requests of a client-streaming call kept for replay; beyond this the call is committed (no more retries).
REPLAY_LIMIT = 1024


class Replay:
    """A request iterator that can be replayed by a later attempt (client-streaming retries).

    Items are recorded as attempts consume them (under a lock: gRPC consumes request iterators on
    its own thread, and a failed attempt's thread may still be inside ``next``). Past ``limit`` items
    the call cannot be retried any more (``replayable`` turns False). Only the newest attempt reads
    the source: an older one ends instead, so it cannot take an item the newest would never see.
    """

    def __init__(self, source: Iterable[Any], limit: int = REPLAY_LIMIT) -> None:
        self._src = iter(source)
        self._buf: list[Any] = []
        self._lock = threading.Lock()
        self._exhausted = False
        self._limit = limit
        self._newest = 0
        self.replayable = True

    def attempt(self) -> Iterator[Any]:
        """A fresh iterator: the recorded items, then the rest of the source."""
        with self._lock:
            self._newest += 1
            me = self._newest
        return self._iterate(me)

    def _iterate(self, me: int) -> Iterator[Any]:
        i = 0
        while True:
            with self._lock:
                if i < len(self._buf):
                    item = self._buf[i]
                elif self._exhausted or me != self._newest:
                    return
                else:
                    try:
                        item = next(self._src)
                    except StopIteration:
                        self._exhausted = True
                        return
                    if self.replayable and len(self._buf) < self._limit:
                        self._buf.append(item)
                    else:
                        self.replayable = False  # an attempt past the buffer can no longer be replayed
            i += 1
            yield item

