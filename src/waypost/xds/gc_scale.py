"""The garbage collector's first threshold, scaled with the ADS streams this process serves.

CPython collects its youngest generation each time 700 more container objects are alive than at the last
collection. A push to S streams has each of them in flight at once (a write, its completion, the client's ACK
and what reading it allocates: about ten objects a stream), so at a few thousand streams every push crossed
that threshold dozens of times: each collection walked objects still in use, moved them to older generations, and
every few pushes a full collection walked every object of the process (tens of milliseconds at 2,000 streams,
and the pushes meanwhile waited). Measured with ``bench/xds_scale.py``, about a fifth of a push's CPU went there,
in waypost as in a bare grpc.aio ADS server.

While streams are open, the first threshold is raised to ``OBJECTS_PER_STREAM`` times the open streams (never
below what it was when the first stream opened), so the objects of one push are freed by their reference counts
before a collection looks at them; when the last stream closes, the threshold is put back. Nothing else changes:
older generations keep their thresholds, and a process that turned the collector off (``gc.disable()``) or set
a higher threshold itself keeps its choice. Cyclic garbage then waits for at most that many allocations longer.
"""

from __future__ import annotations

import gc
import threading

#: objects allowed alive per open stream before a young collection: a push has about ten per stream in flight
OBJECTS_PER_STREAM = 32

_lock = threading.Lock()  # servers on several loops (threads) may share the process
_streams = 0
_base: tuple[int, int, int] | None = None  # the thresholds when the first stream opened


def opened() -> None:
    """A stream opened (any ADS server of this process)."""
    global _streams, _base
    with _lock:
        if _streams == 0:
            _base = gc.get_threshold()
        _streams += 1
        _apply()


def closed() -> None:
    """A stream closed."""
    global _streams
    with _lock:
        _streams = max(_streams - 1, 0)
        _apply()


def _apply() -> None:
    if _base is None:
        return
    first, *older = _base
    want = max(first, OBJECTS_PER_STREAM * _streams) if first else 0  # 0: collection turned off, left so
    if gc.get_threshold()[0] != want:
        gc.set_threshold(want, *older)
