"""Consul's KV store, the little the operator overrides need (``waypost.discovery.override``): read one key
(blocking until it changes, when asked), write a JSON document, delete."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

from ...errors import RegistryError
from .api import MAX_WAIT, ConsulClient, result_index


def _path(key: str) -> str:
    return "/v1/kv/" + urllib.parse.quote(key, safe="/")


def _blocking(client: ConsulClient, index: int, wait: float | None) -> tuple[list[tuple[str, str]], float | None]:
    """The query parameters and the request's bound of a read: blocking from ``index`` for ``wait`` s when both
    are given (bounded by the wait plus a tenth and the client's timeout), else a plain read."""
    if index <= 0 or not wait:
        return [], None
    wait = min(wait, MAX_WAIT)
    return [("index", str(index)), ("wait", f"{wait:g}s")], wait * 1.1 + client.timeout


async def kv_get(client: ConsulClient, key: str, *, index: int = 0, wait: float | None = None
                 ) -> tuple[int, bytes | None]:
    """The key's value (None: no such key) and the index to block on next; with ``index`` > 0 and ``wait``, a
    blocking query that answers when the key changes (or after ``wait`` s)."""
    params, limit = _blocking(client, index, wait)
    headers, body = await client.request("GET", _path(key), params=params, timeout=limit, missing_ok=True,
                                         what=f"reading the key {key!r}")
    new_index = result_index(headers)
    if body is None:
        return new_index, None
    if not isinstance(body, list) or not body or not isinstance(body[0], dict):
        raise RegistryError(f"consul at {client.config.base_url}: the key {key!r} answered {str(body)[:120]!r}")
    raw = body[0].get("Value")
    return new_index, base64.b64decode(raw) if isinstance(raw, str) else b""


async def kv_put(client: ConsulClient, key: str, document: Any) -> None:
    """Write ``document`` as JSON under ``key``."""
    await client.request("PUT", _path(key), body=document, what=f"writing the key {key!r}")


async def kv_delete(client: ConsulClient, key: str) -> None:
    await client.request("DELETE", _path(key), what=f"deleting the key {key!r}")


async def kv_list(client: ConsulClient, prefix: str, *, index: int = 0, wait: float | None = None
                  ) -> tuple[int, list[tuple[str, bytes]]]:
    """Every key under ``prefix`` with its value, and the index to block on next (as ``kv_get``)."""
    params, limit = _blocking(client, index, wait)
    headers, body = await client.request("GET", _path(prefix), params=[("recurse", "1"), *params], timeout=limit,
                                         missing_ok=True, what=f"listing the keys under {prefix!r}")
    new_index = result_index(headers)
    out: list[tuple[str, bytes]] = []
    for item in body if isinstance(body, list) else []:
        if isinstance(item, dict) and isinstance(item.get("Key"), str):
            raw = item.get("Value")
            out.append((item["Key"], base64.b64decode(raw) if isinstance(raw, str) else b""))
    return new_index, out
