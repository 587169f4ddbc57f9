"""The contract between a channel and its resolver: what a resolver is built with and what it must do.

A channel builds one resolver per dial with ``SomeResolver(target, options)`` (``ResolverOptions``), then:

- ``start(on_update, on_error)`` once: ``on_update(backends)`` with the current list as soon as it is known
  and after every change, from any thread; ``on_error(message)`` when resolution fails (the channel keeps
  the last list and shows the message in call errors). With ``options.blocking`` False, ``start`` must not
  block the caller (an event loop) on the network.
- ``resolve_now(reason)`` when a backend connection fails: a hint to re-resolve soon (from any thread,
  never blocking; resolvers with nothing to re-read ignore it).
- ``close()`` (sync channel) or ``await aclose()`` (aio channel) once, when the channel closes.

Every registry kind (etcd, memory, direct, consul, k8s, zk, dns, eureka, a plug-in's) has the one resolver that
does all this, ``ResolverOptions`` included, over its ``waypost.kinds.Discovery``:
``waypost.kinds.resolver.KindResolver``; ``MultiResolver`` merges several.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..types import Backend
from .subset import Subsetter
from .target import Target

#: ``on_update(backends)``: the resolver's current backend list (already subset).
OnUpdate = Callable[[Sequence[Backend]], None]
#: ``on_error(message)``: resolution failed; the last list stays.
OnError = Callable[[str], None]


@dataclass(frozen=True)
class ResolverOptions:
    """What a resolver is built with besides its target.

    ``subsetter`` narrows large backend lists (registry and dns targets); ``channel_options`` are the
    channel's grpc options (a resolver reads its own, e.g. dns refresh intervals; unknown ones are
    ignored); ``blocking`` says whether ``start`` may wait for the first list (sync dial) or must return
    at once (aio dial: never block the event loop). ``report_early`` (non-blocking start): report the
    registry's unreachability through ``on_error`` as soon as it is known (calls then fail at once naming
    it), rather than only when the first load gives up after its timeout (calls wait until then). ``quiet``: the
    caller logs what ``on_error`` reports (the xDS control plane: one line per change of state), so the resolver
    logs its failures at DEBUG only.
    """

    subsetter: Subsetter | None = None
    channel_options: Sequence[tuple[str, Any]] = ()
    blocking: bool = True
    report_early: bool = True
    quiet: bool = False


def notify(fn: Callable[[Any], None], arg: Any, target: Target) -> bool:
    """Call a channel callback (``on_update`` / ``on_error``) from a resolver loop: a callback that raises is
    logged and reported as False, never propagated, so the loop goes on (the control plane never dies)."""
    try:
        fn(arg)
    except Exception:
        logging.getLogger("waypost.resolver").exception("waypost: resolver callback for %s failed", target.redacted)
        return False
    return True


class Resolver(Protocol):
    """What every resolver implements (see the module docstring for when each is called)."""

    def start(self, on_update: OnUpdate, on_error: OnError) -> None: ...

    def resolve_now(self, reason: str) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class ResolverFactory(Protocol):
    """How a resolver is constructed: ``factory(target, options)`` (a resolver class is one)."""

    def __call__(self, target: Target, options: ResolverOptions | None = None, /) -> Resolver: ...
