"""The balancer wrappers alive in this process: for the after-fork hook (``fork``) and the metrics gauges
read at scrape time (registered with ``waypost.metrics`` as a live source, with the target redaction)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from .. import metrics as _metrics
from ..types import STATE_NAMES

_live: weakref.WeakSet[Any] = weakref.WeakSet()


def track(balancer: Any) -> None:
    _live.add(balancer)


def untrack(balancer: Any) -> None:
    _live.discard(balancer)


def live_balancers() -> list[Any]:
    """The live balancer wrappers (a copy: safe to iterate while channels come and go)."""
    return list(_live)


def _channel_samples() -> Iterator[_metrics.ChannelSample]:
    for b in live_balancers():
        if b.closed:
            continue
        counts = dict.fromkeys(STATE_NAMES, 0)
        inflight = []
        for sc in b.subconns():
            inflight.append((sc.address, max(sc.inflight, 0)))
            counts[STATE_NAMES[sc.state] if 0 <= sc.state < len(STATE_NAMES) else "SHUTDOWN"] += 1
        load = [_metrics.BackendLoad(s.address, s.in_flight, s.latency, s.probe_age) for s in b.policy.signals()]
        yield _metrics.ChannelSample(b.target, counts, inflight, load)


_metrics.register_live_source(_channel_samples)
