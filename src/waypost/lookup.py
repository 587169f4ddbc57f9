"""What a registry holds and what a target resolves to, as plain data: shared by the ``waypost ls``, ``resolve``
and ``watch`` commands and the web console (tables and pages are theirs).

``classify`` recognises each record's wire format from its shape (kratos keys under ``/microservices/``,
etcd-naming JSON with ``Addr``, go-zero's raw ``host:port``, go-zero metadata side records) and decodes
it with that format's own decoder, so ``ls`` shows exactly what a subscriber of that format would see.
``follow`` follows a target's resolver; ``resolver_for`` gives the resolver of a one-off lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .discovery.formats import ETCD_NAMING, GOZERO, GOZERO_META_ROOT, KRATOS, valid_address
from .discovery.override import OVERRIDE_ROOT

#: seconds a lookup waits past its timeout for the resolver's own error (which says why)
GRACE = 0.5


def classify(kvs: Iterable[Any]) -> list[dict[str, Any]]:
    """One dict per registration: service, id, address, format, metadata, lease, key.

    Records that match no format are returned with ``format="?"`` and ``address=None``.
    """
    entries: list[dict[str, Any]] = []
    side: dict[tuple[str, str], dict[str, Any]] = {}
    for kv in kvs:
        key, value = kv.key, kv.value
        if key.startswith(GOZERO_META_ROOT):
            rest = key[len(GOZERO_META_ROOT):]
            if "/" in rest:
                service, ident = rest.rsplit("/", 1)
                meta = GOZERO.decode_side(key, value, f"{GOZERO_META_ROOT}{service}/")
                if meta is not None:
                    side[(service, ident)] = {"address": meta.address, "metadata": dict(meta.metadata)}
            continue
        if key.startswith(OVERRIDE_ROOT):  # an operator's weight override (waypost drain): not a registration
            continue
        entries.append(_one(key, value, kv.lease))
    for e in entries:  # join go-zero metadata by (service, id), only when the address agrees
        m = side.get((e["service"], e["id"])) if e["format"] == "gozero" else None
        if m is not None and m["address"] == e["address"]:
            e["metadata"] = m["metadata"]
    return entries


def printable(key: str) -> str:
    """A registry key safe to print: undecodable bytes (kept by surrogateescape) shown as \\xNN."""
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _one(key: str, value: bytes, lease: int) -> dict[str, Any]:
    key = printable(key)
    service, _, ident = key.rpartition("/")
    if not service:  # a key without '/': go-zero's exact-match registration
        service, ident = key, ""
    out: dict[str, Any] = {"key": key, "service": service, "id": ident, "lease": lease, "address": None,
                           "format": "?", "metadata": {}}
    text = value[:65536].decode("utf-8", "replace").strip()
    entry = None
    if key.startswith(KRATOS.namespace + "/") and text.startswith("{"):
        out["format"], entry = "kratos", KRATOS.decode(key, value)
        out["service"] = service[len(KRATOS.namespace) + 1:]
    elif text.startswith("{") and '"Addr"' in text:
        out["format"], entry = "etcd-naming", ETCD_NAMING.decode(key, value)
    elif valid_address(text):
        out["format"], entry = "gozero", GOZERO.decode(key, value)
    else:
        out["value"] = text[:80]
    if entry is not None:
        out["address"] = entry.address
        out["metadata"] = dict(entry.metadata)
    elif out["format"] != "?":
        out["format"] += " (bad value)"
        out["value"] = text[:80]
    return out



def resolver_for(t: Any, timeout: float) -> Any:
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
           timeout: float = 5.0) -> Any:
    """Follow ``target``'s resolver (``waypost watch TARGET``): ``present(addresses, where)`` with the first list,
    ``changed(addresses)`` with each one after (``{address: metadata}``). Returns the started resolver (close it);
    raises RegistryUnavailable when there is no first list within ``timeout``."""
    from .errors import RegistryUnavailable
    from .resolver import parse_target

    t = parse_target(target)
    resolver = resolver_for(t, timeout)
    first = threading.Event()
    errors: list[str] = []

    def on_update(backends: Sequence[Any]) -> None:
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

