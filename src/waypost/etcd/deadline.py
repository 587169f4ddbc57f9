"""The caller's deadline for the etcd calls it makes, as Go's ``context.WithTimeout`` passes it down.

A caller that gives up after its own ``asyncio.wait_for(..., 3)`` cancels the call it waits for; the etcd
client cannot see that timer. ``within(seconds)`` tells it: the calls made inside the block, and in the tasks
created inside it (``asyncio.wait_for`` runs its coroutine in one; tasks copy the context), know when their
caller gives up, so they split that time between their attempts (a failover to another member fits in it)
and end with their own error, naming the cause, rather than being cut without one.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from contextvars import ContextVar

#: the caller's deadline on ``time.monotonic()``; None: no caller budget
_deadline: ContextVar[float | None] = ContextVar("waypost_etcd_caller_deadline", default=None)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """The etcd calls made inside (and in tasks created inside) must be done within ``seconds``. Nested
    blocks keep the earlier deadline."""
    deadline = time.monotonic() + max(seconds, 0.0)
    outer = _deadline.get()
    token = _deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> float | None:
    """Seconds until the caller's deadline, or None when there is none to honour: none was set, or it has
    passed. A caller whose time is up has cancelled what it waited for; a call that still sees that deadline
    runs in a task that merely inherited it (a background task created inside the block), and must not
    inherit a budget that is spent."""
    deadline = _deadline.get()
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    return left if left > 0 else None


def detached() -> contextvars.Context:
    """A copy of the current context without a caller deadline: for the tasks that outlive their caller
    (streams, watchdogs, a publisher's guard and retries), as ``asyncio.create_task(..., context=detached())``
    or ``detached().run(fn, ...)`` around code that starts them."""
    ctx = contextvars.copy_context()
    ctx.run(_deadline.set, None)
    return ctx
