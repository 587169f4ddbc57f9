"""Wire formats: how one registration is laid out in etcd, so Go services can share the registry.

Each format turns ``(key, address, id, metadata)`` into etcd records (``encode``), names the prefix a
subscriber reads (``prefix``), and turns a record back into an ``Entry`` (``decode``). Decoding never
raises: a value it cannot use (garbage, larger than 64 KiB, not UTF-8, wrong JSON types, no usable
address) gives ``None`` and one log line per bad key. See ``docs/wire-formats.md``.

- ``gozero`` (go-zero ``core/discov``): key ``<key>/<id>`` (id: the custom id, else the lease id as a
  decimal int64), value the raw ``host:port``. go-zero subscribers read every key under ``<key>/`` as an
  address, so metadata cannot live there: it goes to a side record ``_waypost/meta/<key>/<id>`` under
  the same lease, value ``{"addr":"host:port","metadata":{...}}``. waypost subscribers read both
  prefixes and join them by id (metadata whose ``addr`` differs from the address is ignored).
- ``etcd-naming`` (grpc-go's etcd resolver, etcd ``endpoints.Manager``): key ``<key>/<address>``, value
  ``{"Op":0,"Addr":"host:port","Metadata":null}`` byte for byte (Metadata: the metadata object if any).
  The id is not used: the key is fixed by the address.
- ``kratos`` (go-kratos ``contrib/registry/etcd``): key ``/microservices/<key>/<id>``, value Go's JSON of
  ``ServiceInstance``: ``{"id","name","version","metadata","endpoints":["grpc://host:port"]}``. Kratos
  metadata is ``map[string]string``: values are written as strings; ``metadata["version"]`` becomes the
  ``version`` field. A subscriber takes the first ``grpc://`` endpoint (``http://`` ones are ignored).
"""

from __future__ import annotations

import abc
import collections
import functools
import itertools
import json
import logging
import re
import sys
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from ..netutil import MAX_ADDRESS_LENGTH, WIRE_BRACKETED_HOST, WIRE_HOST_PORT, WIRE_PLAIN_HOST, valid_address

log = logging.getLogger("waypost.discovery.formats")

#: values larger than this are never decoded (a registration is a few hundred bytes)
MAX_VALUE_BYTES = 64 * 1024
#: where the go-zero format keeps metadata, outside the prefix Go subscribers read
GOZERO_META_ROOT = "_waypost/meta/"
KRATOS_NAMESPACE = "/microservices"

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Entry(NamedTuple):
    """A decoded registration: the address to dial and its metadata (read-only).

    A NamedTuple rather than a frozen dataclass: a big initial load creates one per key.
    """

    address: str
    metadata: Mapping[str, Any] = _EMPTY


@dataclass(frozen=True, slots=True)
class MetaEntry:
    """A decoded side record (go-zero format): metadata for the registration with ``id``."""

    id: str
    address: str
    metadata: Mapping[str, Any]


class _BadLog:
    """Logs a bad record once per key (bounded memory), then stays quiet for that key."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, fmt: str, key: str, why: str) -> None:
        k = (fmt, key)
        with self._lock:
            if k in self._seen:
                self._seen.move_to_end(k)
                first = False
            else:
                self._seen[k] = None
                if len(self._seen) > self._limit:
                    self._seen.popitem(last=False)
                first = True
        if first:
            log.warning("skipping registry record %r (format %s): %s", key, fmt, why)
        else:
            log.debug("skipping registry record %r (format %s): %s", key, fmt, why)

    def forget(self, fmt: str, key: str) -> None:
        """A good value replaced the bad one: log again if it turns bad later."""
        k = (fmt, key)
        if k in self._seen:  # the common case (never bad) needs no lock
            with self._lock:
                self._seen.pop(k, None)


bad_record = _BadLog()


# One line of "\n"-joined values that is a WIRE_HOST_PORT match with a port in 1..65535 (at most 5
# digits, leading zeros allowed: what int() accepts there), so a bulk decode checks a whole batch
# with one regex call and no int(). Neither host form can contain "\n".
_POSSESSIVE = "+" if sys.version_info >= (3, 11) else ""
_HOSTPORT_LINE = (
    rf"(?:{WIRE_BRACKETED_HOST}|{WIRE_PLAIN_HOST}{_POSSESSIVE}):(?=[0-9]{{1,5}}(?:\n|\Z))0*"
    r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
)
_HOSTPORT_IN_RANGE = re.compile(rf"{_HOSTPORT_LINE}\Z")
# Possessive (``++``, ``*+``; Python >= 3.11, else plain) where backtracking can never help: a
# plain host stops at the ":" it excludes, and a line cannot contain "\n". ~30% faster on a big batch.
_HOSTPORT_LINES = re.compile(rf"(?:{_HOSTPORT_LINE}\n)*{_POSSESSIVE}{_HOSTPORT_LINE}\Z")
_new_entry = functools.partial(tuple.__new__, Entry)


def _plain_addresses(values: Sequence[bytes]) -> list[str] | None:
    """The values as text if every one is a UTF-8 ``host:port`` of at most 1,024 bytes with a port
    in range (what GoZero.decode accepts without a word), else None. A few C calls for a batch."""
    if not values or max(map(len, values)) > MAX_ADDRESS_LENGTH:
        return None
    try:
        text = b"\n".join(values).decode("utf-8")
    except UnicodeDecodeError:
        return None
    texts = text.split("\n")
    if len(texts) != len(values) or _HOSTPORT_LINES.match(text) is None:  # a "\n" inside a value
        return None
    return texts


def go_json(obj: Any) -> bytes:
    """JSON as Go's ``encoding/json`` writes it: compact, map keys sorted, struct order kept, HTML escaped.

    Pass structs as dicts in field order and maps through ``_sorted_map`` (done recursively for any
    nested mapping below the top level).
    """
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Go escapes these even outside HTML; they only ever occur inside strings
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text.encode("utf-8", "surrogatepass")


def _sorted_map(value: Any) -> Any:
    """Recursively sort mapping keys (Go sorts map keys when marshalling)."""
    if isinstance(value, Mapping):
        return {str(k): _sorted_map(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_sorted_map(v) for v in value]
    return value


def _text(fmt: str, key: str, value: bytes) -> str | None:
    if len(value) > MAX_VALUE_BYTES:
        bad_record(fmt, key, f"value of {len(value)} bytes exceeds {MAX_VALUE_BYTES}")
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        bad_record(fmt, key, "value is not UTF-8")
        return None


def _json_object(fmt: str, key: str, value: bytes) -> dict[str, Any] | None:
    text = _text(fmt, key, value)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        bad_record(fmt, key, f"value is not JSON ({e.__class__.__name__})")
        return None
    if not isinstance(obj, dict):
        bad_record(fmt, key, f"value is JSON {type(obj).__name__}, expected an object")
        return None
    return obj


def _go_field(obj: Mapping[str, Any], name: str) -> Any:
    """Go's json.Unmarshal matches field names case-insensitively (exact match preferred)."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if k.lower() == low:
            return v
    return None


def _freeze(md: Mapping[str, Any] | None) -> Mapping[str, Any]:
    # Shallow on purpose (unlike service_config.jsonvalue.freeze): registration metadata is handed on to pickers,
    # the CLI's JSON output and users as it was decoded, nested values included; only the top level is shared.
    return MappingProxyType(dict(md)) if md else _EMPTY


class WireFormat(abc.ABC):
    """One way to lay registrations out in etcd."""

    name: str

    def prefix(self, key: str, exact: bool = False) -> str:
        """What a subscriber reads: a prefix ending in ``/``, or with ``exact`` the key itself."""
        return key if exact else key + "/"

    def record_key(self, key: str, address: str, id: int | str) -> str:
        """The etcd key of the main record."""
        return f"{key}/{id}"

    @abc.abstractmethod
    def encode(
        self, key: str, address: str, id: int | str, metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, bytes]:
        """The main record ``(etcd_key, value)`` for one registration."""

    def encode_side(
        self, key: str, address: str, id: int | str, metadata: Mapping[str, Any] | None = None,
    ) -> list[tuple[str, bytes]]:
        """Extra records put under the same lease (none for most formats)."""
        return []

    @abc.abstractmethod
    def decode(self, etcd_key: str, value: bytes) -> Entry | None:
        """An Entry, or None (logged once per key) when the record is unusable."""

    def decode_many(self, keys: Sequence[str], values: Sequence[bytes]) -> list[tuple[str, Entry]]:
        """``(etcd_key, Entry)`` for each usable record of the parallel ``keys``/``values``, in
        order: ``decode`` over a big read (unusable records are logged and left out, as ``decode``
        does)."""
        if len(keys) != len(values):
            raise ValueError(f"decode_many: {len(keys)} keys but {len(values)} values")
        decode = self.decode
        out = []
        for key, value in zip(keys, values):
            entry = decode(key, value)
            if entry is not None:
                out.append((key, entry))
        return out

    # side records (go-zero metadata); formats without them keep these defaults
    def decode_plain(self, keys: Sequence[str], values: Sequence[bytes]) -> list[str] | None:
        """The addresses, when every record of the parallel ``keys``/``values`` decodes to a bare
        address with no metadata (what ``decode_many`` would give, without an Entry per record);
        else None and the caller uses ``decode_many``. Formats without such a fast path say None.

        Worth it with ``Container.bulk_load_plain``: the pair fills a view from 10,000 plain records
        in ~5.6 ms where ``decode_many`` + ``Container.apply`` take ~8.6 ms, and the group's work
        after the Get in ~9 ms instead of ~14 ms: a fifth of the 10,000-endpoint initial load of
        bench/discovery.py (~23 ms)."""
        return None

    def side_prefix(self, key: str) -> str | None:
        return None

    def decode_side(self, etcd_key: str, value: bytes, side_prefix: str) -> MetaEntry | None:
        return None

    def join_id(self, etcd_key: str, prefix: str) -> str:
        """The id a main record is joined on with its side record."""
        return etcd_key[len(prefix):]


def _check_address(address: str) -> str:
    if not isinstance(address, str) or not valid_address(address):
        raise ValueError(f"invalid address {address!r}: expected host:port")
    return address


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"invalid registry key {key!r}: expected a non-empty string")
    return key


def _id_text(id: int | str) -> str:
    if isinstance(id, bool) or not isinstance(id, (int, str)):
        raise TypeError(f"invalid id {id!r}: expected an int or a string")
    text = str(id)
    if not text or "/" in text:
        raise ValueError(f"invalid id {id!r}: must be non-empty and contain no '/'")
    return text


class GoZero(WireFormat):
    """go-zero's layout (see the module docstring)."""

    name = "gozero"

    def encode(
        self, key: str, address: str, id: int | str, metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, bytes]:
        _check_key(key)
        return f"{key}/{_id_text(id)}", _check_address(address).encode()

    def side_prefix(self, key: str) -> str | None:
        return f"{GOZERO_META_ROOT}{key}/"

    def encode_side(
        self, key: str, address: str, id: int | str, metadata: Mapping[str, Any] | None = None,
    ) -> list[tuple[str, bytes]]:
        if not metadata:
            return []
        value = go_json({"addr": _check_address(address), "metadata": _sorted_map(dict(metadata))})
        return [(f"{GOZERO_META_ROOT}{_check_key(key)}/{_id_text(id)}", value)]

    def decode(self, etcd_key: str, value: bytes) -> Entry | None:
        try:  # the hot path of a big initial load: keep it to a decode and a regex match
            text = value.decode("utf-8") if len(value) <= MAX_VALUE_BYTES else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            _text(self.name, etcd_key, value)  # logs why
            return None
        m = WIRE_HOST_PORT.match(text)
        if m is not None and 0 < int(m.group(1)) < 65536 and len(text) <= MAX_ADDRESS_LENGTH:
            bad_record.forget(self.name, etcd_key)
            return Entry(text)
        if not valid_address(text):
            bad_record(self.name, etcd_key, f"value {text[:80]!r} is not a host:port address")
            return None
        bad_record.forget(self.name, etcd_key)
        return Entry(text)

    def decode_many(self, keys: Sequence[str], values: Sequence[bytes]) -> list[tuple[str, Entry]]:
        """``decode`` over many records. A batch of plain addresses (the usual case) is checked in
        one pass over the joined values; otherwise each value is checked inline (one regex, no call
        per record). For 10,000 records: ~4.6 ms, ~7 ms inline, ~18 ms calling ``decode`` per record
        (the 10,000-endpoint initial load of bench/discovery.py takes ~23 ms)."""
        texts = self.decode_plain(keys, values)
        if texts is None:
            return self._decode_each(keys, values)
        return list(zip(keys, map(_new_entry, zip(texts, itertools.repeat(_EMPTY)))))

    def decode_plain(self, keys: Sequence[str], values: Sequence[bytes]) -> list[str] | None:
        if len(keys) != len(values):
            raise ValueError(f"decode_many: {len(keys)} keys but {len(values)} values")
        texts = _plain_addresses(values)
        if texts is not None and bad_record._seen:  # good values make us forget keys logged as bad
            for key in keys:
                bad_record.forget(self.name, key)
        return texts

    def _decode_each(self, keys: Sequence[str], values: Sequence[bytes]) -> list[tuple[str, Entry]]:
        out: list[tuple[str, Entry]] = []
        append = out.append
        match = _HOSTPORT_IN_RANGE.match
        seen = bad_record._seen
        for key, value in zip(keys, values):
            if len(value) <= MAX_ADDRESS_LENGTH:  # longer is never a valid address: decode() says why
                try:
                    text = value.decode("utf-8")
                except UnicodeDecodeError:
                    text = ""
                if match(text) is not None:
                    if seen:
                        bad_record.forget(self.name, key)
                    append((key, _new_entry((text, _EMPTY))))
                    continue
            entry = self.decode(key, value)  # unix: addresses, or a bad record (logged)
            if entry is not None:
                append((key, entry))
        return out

    def decode_side(self, etcd_key: str, value: bytes, side_prefix: str) -> MetaEntry | None:
        obj = _json_object(self.name, etcd_key, value)
        if obj is None:
            return None
        addr, md = obj.get("addr"), obj.get("metadata")
        if not isinstance(addr, str) or not isinstance(md, dict):
            bad_record(self.name, etcd_key, "metadata record needs a string 'addr' and an object 'metadata'")
            return None
        return MetaEntry(etcd_key[len(side_prefix):], addr, _freeze(md))


class SideRecords:
    """A subscription's side records (the go-zero format's metadata) by id, and their join with main records.

    The main record ``<main_prefix><id>`` (``WireFormat.join_id``) pairs with the side record
    ``<side_prefix><id>``. A side record's metadata joins a main record only when both name the same address:
    a side record left behind by an id now used for another address adds nothing. With no side records (other
    formats, exact keys, no read permission on the side prefix) ``join`` hands entries back unchanged.
    """

    __slots__ = ("fmt", "main_prefix", "meta", "side_prefix")

    def __init__(self, fmt: WireFormat, main_prefix: str, side_prefix: str) -> None:
        self.fmt = fmt
        self.main_prefix = main_prefix
        self.side_prefix = side_prefix
        self.meta: dict[str, MetaEntry] = {}  # id -> side record

    def __len__(self) -> int:
        return len(self.meta)

    def side_key(self, main_key: str) -> str:
        """The key of the side record of the main record ``main_key``."""
        return self.side_prefix + self.fmt.join_id(main_key, self.main_prefix)

    def main_key(self, side_key: str) -> str:
        """The key of the main record the side record ``side_key`` belongs to."""
        return self.main_prefix + side_key[len(self.side_prefix):]

    def knows(self, main_key: str) -> bool:
        """True when the side record of ``main_key`` has been read (and was usable)."""
        return self.fmt.join_id(main_key, self.main_prefix) in self.meta

    def put(self, side_key: str, value: bytes) -> str:
        """Take in the side record ``side_key`` = ``value`` (an unusable one counts as none: logged, dropped);
        the main record whose metadata it is."""
        ident = side_key[len(self.side_prefix):]
        meta = self.fmt.decode_side(side_key, value, self.side_prefix)
        if meta is None:
            self.meta.pop(ident, None)
        else:
            self.meta[ident] = meta
        return self.main_prefix + ident

    def delete(self, side_key: str) -> str:
        """Forget the side record ``side_key``; the main record whose metadata it was."""
        self.meta.pop(side_key[len(self.side_prefix):], None)
        return self.main_key(side_key)

    def clear(self) -> None:
        self.meta = {}

    def join(self, main_key: str, entry: Entry) -> Entry:
        """``entry`` (decoded from ``main_key``) with its side record's metadata when the addresses agree."""
        meta = self.meta.get(self.fmt.join_id(main_key, self.main_prefix)) if self.meta else None
        if meta is not None and meta.address == entry.address:
            return Entry(entry.address, meta.metadata)
        return entry


class EtcdNaming(WireFormat):
    """grpc-go's etcd naming layout (see the module docstring)."""

    name = "etcd-naming"

    def record_key(self, key: str, address: str, id: int | str) -> str:
        return f"{key}/{address}"

    def encode(
        self, key: str, address: str, id: int | str = 0, metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, bytes]:
        _check_key(key)
        _check_address(address)
        md = _sorted_map(dict(metadata)) if metadata else None
        return f"{key}/{address}", go_json({"Op": 0, "Addr": address, "Metadata": md})

    def decode(self, etcd_key: str, value: bytes) -> Entry | None:
        obj = _json_object(self.name, etcd_key, value)
        if obj is None:
            return None
        op, addr, md = _go_field(obj, "Op"), _go_field(obj, "Addr"), _go_field(obj, "Metadata")
        if op is not None and (isinstance(op, bool) or not isinstance(op, int) or not 0 <= op <= 255):
            bad_record(self.name, etcd_key, f"'Op' must be an integer 0..255, got {op!r}"[:200])
            return None
        if not isinstance(addr, str) or not valid_address(addr):
            bad_record(self.name, etcd_key, f"'Addr' {str(addr)[:80]!r} is not a host:port address")
            return None
        bad_record.forget(self.name, etcd_key)
        # Metadata is `any` in Go: only an object can become our metadata mapping
        return Entry(addr, _freeze(md) if isinstance(md, dict) else _EMPTY)


def _kratos_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)


class Kratos(WireFormat):
    """go-kratos' etcd registry layout (see the module docstring)."""

    name = "kratos"

    def __init__(self, namespace: str = KRATOS_NAMESPACE) -> None:
        self.namespace = namespace.rstrip("/")

    def prefix(self, key: str, exact: bool = False) -> str:
        return key if exact else f"{self.namespace}/{key}/"

    def record_key(self, key: str, address: str, id: int | str) -> str:
        return f"{self.namespace}/{key}/{id}"

    def encode(
        self, key: str, address: str, id: int | str, metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, bytes]:
        _check_key(key)
        _check_address(address)
        ident = _id_text(id)
        md = {str(k): _kratos_str(v) for k, v in (metadata or {}).items()}
        version = md.pop("version", "")
        value = go_json({
            "id": ident, "name": key, "version": version,
            "metadata": _sorted_map(md) if md else None, "endpoints": [f"grpc://{address}"],
        })
        return f"{self.namespace}/{key}/{ident}", value

    def decode(self, etcd_key: str, value: bytes) -> Entry | None:
        obj = _json_object(self.name, etcd_key, value)
        if obj is None:
            return None
        fields = {f: _go_field(obj, f) for f in ("id", "name", "version", "metadata", "endpoints")}
        for f in ("id", "name", "version"):
            if fields[f] is not None and not isinstance(fields[f], str):
                bad_record(self.name, etcd_key, f"'{f}' must be a string")
                return None
        md, eps = fields["metadata"], fields["endpoints"]
        if md is not None and not (isinstance(md, dict) and all(isinstance(v, str) for v in md.values())):
            bad_record(self.name, etcd_key, "'metadata' must be an object of strings")
            return None
        if not isinstance(eps, list) or not all(isinstance(e, str) for e in eps):
            bad_record(self.name, etcd_key, "'endpoints' must be a list of strings")
            return None
        # Kratos itself skips instances whose name differs from the one asked for
        ns = self.namespace + "/"
        if etcd_key.startswith(ns) and "/" in etcd_key[len(ns):]:
            name = etcd_key[len(ns):].rsplit("/", 1)[0]
            if fields["name"] not in (None, name):
                bad_record(self.name, etcd_key, f"instance name {fields['name']!r} is not {name!r}")
                return None
        addr = next((a for a in map(_grpc_endpoint, eps) if a is not None), None)
        if addr is None:
            bad_record(self.name, etcd_key, "no grpc:// endpoint with a host:port")
            return None
        out = dict(md or {})
        if fields["version"] and "version" not in out:
            out["version"] = fields["version"]
        bad_record.forget(self.name, etcd_key)
        return Entry(addr, _freeze(out))


def _grpc_endpoint(url: str) -> str | None:
    if not url.startswith("grpc://"):
        return None
    try:
        netloc = urllib.parse.urlsplit(url).netloc
    except ValueError:
        return None
    return netloc if valid_address(netloc) else None


GOZERO = GoZero()
ETCD_NAMING = EtcdNaming()
KRATOS = Kratos()

#: the wire formats by name, in the order lists show them (the first is the default)
FORMATS: dict[str, WireFormat] = {f.name: f for f in (GOZERO, ETCD_NAMING, KRATOS)}
FORMAT_NAMES = tuple(FORMATS)
DEFAULT_FORMAT = GOZERO.name


def get_format(name: str | WireFormat) -> WireFormat:
    """The format called ``name``; ValueError listing the known ones when unknown."""
    if isinstance(name, WireFormat):
        return name
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown wire format {name!r}; known formats: {', '.join(sorted(FORMATS))}") from None
