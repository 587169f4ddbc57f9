"""What the ``waypost ls``, ``resolve`` and ``watch`` commands show, as plain data (tables are the commands' job):
the lease TTLs and services of ``ls``, the one-off lookup of ``resolve`` with its hints (another wire format, a
close key), ``watch``'s reachability thread, and ``--meta k=v`` options. What the web console shows too (each
record's wire format, following a target) is in ``waypost.lookup``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..discovery.listing import classify
from ..lookup import GRACE, resolver_for

if TYPE_CHECKING:
    from ..discovery.store import Registry, SyncRegistry

#: at most this many distinct leases are asked for their TTL by ``ls``
MAX_TTL_LOOKUPS = 256


def lease_ttls(sync_registry: SyncRegistry, entries: Sequence[dict[str, Any]]) -> dict[int, int]:
    """Remaining TTL per lease (-1: expired), for at most MAX_TTL_LOOKUPS leases."""
    leases = sorted({e["lease"] for e in entries if e["lease"]})[:MAX_TTL_LOOKUPS]
    return {lease: int(sync_registry.time_to_live(lease)) for lease in leases}


def group(entries: Sequence[dict[str, Any]], ttls: dict[int, int]) -> dict[str, list[dict[str, Any]]]:
    """Entries by service, each list sorted by address; ``ttl`` added (None: no lease or not looked up)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        item = dict(e, ttl=ttls.get(e["lease"]) if e["lease"] else None)
        out.setdefault(e["service"], []).append(item)
    for items in out.values():
        items.sort(key=lambda i: (i["address"] or "", i["key"]))
    return dict(sorted(out.items()))


def resolve(target: str, *, subset_size: int = 32, client_id: str | None = None,
            timeout: float = 5.0) -> dict[str, Any]:
    """What a client dialing ``target`` would use now: every address with its metadata, and its subset.

    A lookup that fails (registry unreachable, DNS server silent, name unknown) raises
    ``RegistryUnavailable`` naming the target and the cause, within ``timeout`` seconds (and a little:
    the resolver's own timeout is ``timeout``, so its error, which says why, arrives first).
    """
    from ..errors import RegistryUnavailable
    from ..resolver import Resolver, Subsetter, parse_target

    t = parse_target(target)
    subsetter = Subsetter(subset_size, client_id=client_id) if subset_size and t.scheme != "direct" else None
    got: list[Any] = []
    errors: list[str] = []
    answered = threading.Event()

    def on_update(backends: Sequence[Any]) -> None:
        got[:] = list(backends)
        answered.set()

    def on_error(message: str) -> None:
        errors.append(message)
        answered.set()

    # no subsetter: we want the full list and mark the subset ourselves; the lookup bounded by ``timeout``
    resolver: Resolver = resolver_for(t, timeout)
    try:
        resolver.start(on_update, on_error)
        if not answered.wait(timeout + GRACE):
            raise RegistryUnavailable(f"could not resolve {t.redacted}: no answer within {timeout:g}s")
        if not got and errors:  # a failed lookup fails: the command must not show an empty list
            raise RegistryUnavailable(f"could not resolve {t.redacted}: {errors[-1]}")
        backends = list(got)
    finally:
        resolver.close()
    chosen = {b.address for b in subsetter.select(backends)} if subsetter else {b.address for b in backends}
    note = None
    if subsetter is not None and client_id is None and len(backends) > subset_size:
        note = (f"note: {len(backends)} addresses > subset size {subset_size}; a client keeps a stable subset "
                "from its own random seed (this is one such subset; --client-id N for deterministic subsetting)")
    close: list[str] | None = None
    if t.uses_registry and t.key:
        hint = other_formats_hint(t.registry_url(), t.key, t.format, len(backends), exact=t.exact)
        note = f"{note}\n{hint}" if note and hint else (note or hint)
        if not backends and not hint:
            close = close_keys_in(t.registry_url(), t.key, timeout)
    return {
        "target": t.redacted, "scheme": t.scheme, "key": t.key, "format": t.format if t.uses_registry else None,
        "subset_size": subset_size if subsetter else None, "client_id": client_id,
        "backends": [{"address": b.address, "metadata": dict(b.metadata), "in_subset": b.address in chosen}
                     for b in backends],
        "note": note,
        "close_keys": close,
    }


def close_keys_in(registry: str | Registry, key: str, timeout: float) -> list[str]:
    """The service keys of ``registry`` closest to ``key`` (a key with nothing registered: a misspelt one?),
    best first; [] when none is close or the keys cannot be read within ``timeout``."""
    from ..client.empty_key import LIST_LIMIT, close_keys
    from ..discovery.connections import connect
    from ..discovery.store import SyncRegistry

    try:
        reg = connect(registry) if isinstance(registry, str) else registry
        kvs = SyncRegistry(reg, timeout=timeout).get("", prefix=True, keys_only=True, limit=LIST_LIMIT).kvs
    except Exception:  # noqa: BLE001 -- a hint only
        return []
    return close_keys(key, (kv.key for kv in kvs))



def other_formats_hint(registry: str | Registry, key: str, fmt: str, found: int, *, exact: bool = False) -> str | None:
    """A note when ``key``'s records are in another wire format than ``fmt`` (what was asked): a go-zero client
    asked for etcd-naming records shows nothing, which otherwise looks like a service with no instance. None
    when nothing else is there (or it cannot be read: the lookup itself already said what it could)."""
    from ..discovery.connections import connect

    try:
        reg = connect(registry) if isinstance(registry, str) else registry
        prefix = key if exact else key.rstrip("/") + "/"
        kvs = reg.sync.get(prefix, prefix=not exact).kvs
    except Exception:  # noqa: BLE001 -- a hint only
        return None
    counts: dict[str, int] = {}
    for e in classify(kvs):
        if e["address"] is not None and e["format"] != fmt:
            counts[e["format"]] = counts.get(e["format"], 0) + 1
    if not counts:
        return None
    other = max(counts, key=counts.__getitem__)
    return (f"note: {sum(counts.values())} record(s) under {prefix!r} are in another wire format "
            f"({', '.join(f'{n} {f}' for f, n in sorted(counts.items()))}) than {fmt!r}, which found {found}: "
            f"try format={other}")


#: how often ``waypost watch KEY`` checks that its registry still answers, and how long one check may take
REACH_INTERVAL = 1.0
REACH_TIMEOUT = 3.0


def follow_reachability(registry: Registry, key: str, on_change: Callable[[str | None], None],
                        stop: threading.Event, *, interval: float = REACH_INTERVAL,
                        timeout: float = REACH_TIMEOUT) -> threading.Thread:
    """``waypost watch KEY`` through an outage: a thread that reads ``key`` (one key, keys only) every
    ``interval`` seconds until ``stop`` is set, and calls ``on_change(why)`` when the registry stops answering
    (``why``: its own account, such as "etcd at h:2379 unreachable: connection refused") and ``on_change(None)``
    when it answers again: once per change, never per check."""
    from .. import _loop
    from ..discovery.store import SyncRegistry

    reader = SyncRegistry(registry, timeout=timeout)

    def why_down(e: BaseException) -> str:
        try:
            why = _loop.run(registry.unreachable(), timeout)
        except Exception:  # noqa: BLE001 -- a diagnosis only
            why = None
        return str(why or e or type(e).__name__)

    def run() -> None:
        down = False
        while not stop.wait(interval):
            try:
                reader.get(key, keys_only=True, limit=1)
            except Exception as e:  # noqa: BLE001 -- any failure to read is "unreachable" for this purpose
                if not down and not stop.is_set():
                    down = True
                    on_change(why_down(e))
                continue
            if down:
                down = False
                on_change(None)

    t = threading.Thread(target=run, name="waypost-watch-reachability", daemon=True)
    t.start()
    return t


def parse_meta(items: Iterable[str]) -> dict[str, Any]:
    """``--meta k=v`` options as metadata: numbers and booleans typed (``weight=20`` is the number 20)."""
    import json

    meta: dict[str, Any] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"--meta {item!r}: expected k=v (example: --meta weight=20)")
        try:
            val: Any = json.loads(v)
            if not isinstance(val, (int, float, bool)):
                val = v
        except ValueError:
            val = v
        meta[k] = val
    return meta
