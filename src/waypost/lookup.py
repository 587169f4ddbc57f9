"""What a target resolves to, as plain data: shared by the ``waypost resolve`` and ``watch`` commands and the web
console (tables and pages are theirs). ``follow`` follows a target's resolver; ``resolver_for`` gives the resolver
of a one-off lookup. (What a keyed registry holds, for ``waypost ls``: ``discovery/listing.py``.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .resolver import Resolver, Target
    from .types import Backend

#: seconds a lookup waits past its timeout for the resolver's own error (which says why)
GRACE = 0.5


def resolver_for(t: Target, timeout: float) -> Resolver:
    """The resolver of target ``t`` for a one-off lookup: blocking (its start raises RegistryUnavailable naming
    why), the first answer bounded by ``timeout``, no subsetting (the full list is shown)."""
    from .resolver import ResolverOptions, make_resolver, resolver_factory

    if t.scheme == "dns" or t.uses_registry:  # blocking already: their start raises naming why
        return resolver_factory(t.scheme)(t, timeout=timeout)  # type: ignore[call-arg]
    if t.scheme != "direct":  # a kind followed by a loop (consul, k8s, zk, a plug-in's) or several targets
        return resolver_factory(t.scheme)(t, ResolverOptions(blocking=True), timeout=timeout)  # type: ignore[call-arg]
    return make_resolver(t)


def follow(target: str, present: Callable[[dict[str, dict[str, Any]], str], None],
           changed: Callable[[dict[str, dict[str, Any]]], None], on_error: Callable[[str], None], *,
           timeout: float = 5.0) -> Resolver:
    """Follow ``target``'s resolver (``waypost watch TARGET``): ``present(addresses, where)`` with the first list,
    ``changed(addresses)`` with each one after (``{address: metadata}``). Returns the started resolver (close it);
    raises RegistryUnavailable when there is no first list within ``timeout``."""
    from .errors import RegistryUnavailable
    from .resolver import parse_target

    t = parse_target(target)
    resolver = resolver_for(t, timeout)
    first = threading.Event()
    errors: list[str] = []

    def on_update(backends: Sequence[Backend]) -> None:
        now = {b.address: dict(b.metadata) for b in backends}
        if first.is_set():
            changed(now)
        else:
            present(now, t.redacted)
            first.set()

    def on_err(message: str) -> None:
        errors.append(message)
        on_error(message)

    try:
        resolver.start(on_update, on_err)
        if not first.wait(timeout + GRACE):
            raise RegistryUnavailable(f"could not resolve {t.redacted} within {timeout:g}s"
                                      f"{f': {errors[-1]}' if errors else ''}")
    except BaseException:
        resolver.close()
        raise
    return resolver

