"""Metadata values as text, for registries whose metadata is a map of strings.

Some registries keep an instance's metadata as string -> string (a service's Meta, an application instance's
metadata). waypost's metadata values are JSON values, so one rule carries them both ways:

- a string that would not read as JSON goes as it is (``"eu-1"`` -> ``eu-1``): what people and other clients
  write reads naturally;
- any other value goes as compact JSON (``20`` -> ``20``, ``True`` -> ``true``, ``{"a": 1}`` -> ``{"a":1}``),
  and so does a string that would read as JSON (``"20"`` -> ``"\\"20\\""``), so decoding gives every value back;
- decoding: text that is JSON decodes (NaN, Infinity and numbers too large for a float excepted: they stay
  the text they are), any other text stays a string.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN/Infinity (raises ValueError)."""
    def refuse(name: str) -> Any:
        raise ValueError(name)

    return json.loads(text, parse_constant=refuse)


def _is_json(text: str) -> bool:
    try:
        _strict_json(text)
    except ValueError:
        return False
    return True


def encode_value(key: str, value: Any, *, quote_empty: bool = False) -> str:
    """The text of metadata value ``value`` (of ``key``, named in errors); ``quote_empty``: an empty string goes
    as JSON (``""``) for a registry where an empty value means no value. TypeError/ValueError for what JSON
    cannot carry."""
    if isinstance(value, str) and (value or not quote_empty) and not _is_json(value):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise type(e)(f"metadata[{key!r}]: {e}") from None


def decode_value(value: Any) -> Any:
    """A metadata value back from its text (anything not a string is returned as it is)."""
    if not isinstance(value, str):
        return value
    try:
        decoded = _strict_json(value)
    except ValueError:
        return value
    if isinstance(decoded, float) and not math.isfinite(decoded):  # e.g. 1e999
        return value
    return decoded
