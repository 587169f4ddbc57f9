"""Fork safety of the balanced channels: what happens to them in a forked child.

grpc channels inherited across ``fork()`` are unusable in the child, and locks may be held by parent
threads that do not exist there. The hook below runs in the child right after the fork and does no grpc
call: every live balancer wrapper drops its inherited state and takes fresh locks
(``BalancerWrapper.mark_forked``); its first use in the child then reconnects every backend and the
channel re-registers what it runs (``on_refork``, e.g. the connectivity poller).
"""

from __future__ import annotations

import os

from . import live

_installed = False


def _after_fork_in_child() -> None:
    for b in live.live_balancers():
        b.mark_forked()


def install_after_fork_hook() -> None:
    """Register the hook once per process (idempotent; a no-op where os has no fork hooks)."""
    global _installed
    if _installed:
        return
    _installed = True
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
