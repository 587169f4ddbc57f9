"""The balancer wrappers alive in this process: for the after-fork hook and the metrics gauges read at scrape
time (registered with ``waypost.metrics`` as a live source, with the target redaction).

Fork safety of the balanced channels: grpc channels inherited across ``fork()`` are unusable in the child, and
locks may be held by parent threads that do not exist there. The hook (``install_after_fork_hook``) runs in the
child right after the fork and does no grpc call: every live balancer wrapper drops its inherited state and takes
fresh locks (``BalancerWrapper.mark_forked``); its first use in the child then reconnects every backend and the
channel re-registers what it runs (``on_refork``, e.g. the connectivity poller). What happens to the control loop
and its grpc.aio channels around a fork is ``waypost._fork``'s job.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
from typing import Protocol

from .. import metrics as _metrics
from ..balancer.base import Policy
from ..types import STATE_NAMES
from .subconn import SubConn


class LiveBalancer(Protocol):
    """What this module reads of a channel's balancer (``BalancerWrapper``, which registers itself here)."""

    target: str
    policy: Policy

    @property
    def closed(self) -> bool: ...

    def subconns(self) -> Iterable[SubConn]: ...

    def mark_forked(self) -> None: ...

_live: weakref.WeakSet[LiveBalancer] = weakref.WeakSet()


def track(balancer: LiveBalancer) -> None:
    _live.add(balancer)


def untrack(balancer: LiveBalancer) -> None:
    _live.discard(balancer)


def live_balancers() -> list[LiveBalancer]:
    """The live balancer wrappers (a copy: safe to iterate while channels come and go)."""
    return list(_live)


_fork_hook_installed = False


def _after_fork_in_child() -> None:
    for b in live_balancers():
        b.mark_forked()


def install_after_fork_hook() -> None:
    """Register the after-fork hook once per process (idempotent; a no-op where os has no fork hooks)."""
    global _fork_hook_installed
    if _fork_hook_installed:
        return
    _fork_hook_installed = True
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _channel_samples() -> Iterator[_metrics.ChannelSample]:
    for b in live_balancers():
        if b.closed:
            continue
        counts = dict.fromkeys(STATE_NAMES, 0)
        inflight = []
        for sc in b.subconns():
            inflight.append((sc.address, max(sc.inflight, 0)))
            counts[STATE_NAMES[sc.state] if 0 <= sc.state < len(STATE_NAMES) else "SHUTDOWN"] += 1
        yield _metrics.ChannelSample(b.target, counts, inflight, b.policy.signals())


_metrics.register_live_source(_channel_samples)
