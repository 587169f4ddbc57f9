"""Service-config JSON: strict loading, normalisation to plain dicts/lists, and a read-only copy."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NoReturn

from ..errors import InvalidServiceConfig, describe_value
from .fields import fail

#: JSON nesting deeper than this is refused (service configs are a few levels deep)
MAX_DEPTH = 64


def load_json(text: str | bytes | bytearray) -> Any:
    def no_constants(name: str) -> NoReturn:
        fail("service config", f"{name} is not valid JSON (numbers must be finite)")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, val in pairs:
            if key in obj:
                fail("service config", f"duplicate key {key!r} in a JSON object")
            obj[key] = val
        return obj

    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        fail("service config", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except UnicodeDecodeError as exc:
        fail("service config", f"not valid UTF-8 text: {exc.reason} at byte {exc.start}")
    except RecursionError:
        fail("service config", f"JSON nested too deeply (at most {MAX_DEPTH} levels)")
    except ValueError as exc:  # e.g. an integer literal with more digits than Python allows
        if isinstance(exc, InvalidServiceConfig):
            raise
        fail("service config", f"not valid JSON: {exc}")


def normalize(value: object, path: str, depth: int) -> Any:
    """A plain-dict/list deep copy of a JSON-like value; rejects what JSON cannot hold."""
    if depth > MAX_DEPTH:
        fail(path, f"nested too deeply (at most {MAX_DEPTH} levels)")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            fail(path, f"{value} is not a valid JSON number")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                fail(path, f"object keys must be strings, got {describe_value(key)}")
            out[key] = normalize(item, f"{path}.{key}" if depth else key, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    fail(path, f"{type(value).__name__} is not a JSON value")


def freeze(value: Any) -> Any:
    """A read-only view of a normalized JSON value (objects -> mapping proxies, lists -> tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(freeze(item) for item in value)
    return value
