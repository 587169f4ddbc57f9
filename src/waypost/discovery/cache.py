"""The on-disk cache of a subscription's last list: ``Subscriber(..., cache_file=PATH)``, ``?cache=PATH``.

What it is for: a client that starts while etcd cannot be read at all gets the list it last saw
(``waypost.discovery.stale`` decides when; never in preference to an answer from etcd).

The file is JSON, written atomically (a temporary file in the same directory, then ``os.replace``)::

    {"waypost": "discovery-cache", "version": 1, "key": "greet.rpc", "exact": false, "format": "gozero",
     "registry": "etcd://127.0.0.1:2379", "written": 1767225600.0,
     "sources": {"greet.rpc/": {"revision": 42, "records": [["greet.rpc/7587...", "MTI3LjAuMC4xOjgwODA=", 40]]},
                 "_waypost/meta/greet.rpc/": {"revision": 42, "records": []}}}

``sources`` holds the raw records (etcd key, base64 value, mod_revision) of each range the subscription
reads, so a cached list goes through the same decoding as a live one and the live read that follows is
a plain diff against it. ``key``, ``exact`` and ``format`` must match the subscription (a file of another
service is "foreign"); ``registry`` (passwords removed) is informative only. A file that does not parse
is refused with ``CacheError`` (the caller logs it and goes on without it); the parser never raises
anything else. No fsync: a file torn by a crash fails to parse and is ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import _loop
from ..redaction import redact_url
from .store import ValueColumns

log = logging.getLogger("waypost.discovery")

MAGIC = "discovery-cache"
VERSION = 1
#: a cache file bigger than this is not read (a 10,000-backend list is ~1 MB)
MAX_BYTES = 64 * 1024 * 1024
#: at most one write per this many seconds while the list keeps changing (and one at close)
MIN_INTERVAL = 1.0


class CacheError(ValueError):
    """A cache file that cannot be used: unreadable, corrupt, of another version or of another service."""


@dataclass(frozen=True)
class CachedList:
    """A parsed cache file: when it was written, and the records of each range (``ValueColumns`` in
    key order, the ``revision`` the list was read at)."""

    written: float
    sources: Mapping[str, ValueColumns]


def encode(key: str, exact: bool, fmt: str, registry_url: str,
           sources: Iterable[tuple[str, int, Mapping[str, tuple[bytes, int]]]], written: float | None = None) -> bytes:
    """The file's bytes for the raw records of each range: (prefix, revision, etcd key -> (value, mod_revision))."""
    doc = {
        "waypost": MAGIC, "version": VERSION, "key": key, "exact": exact, "format": fmt,
        "registry": redact_url(registry_url), "written": time.time() if written is None else written,
        "sources": {
            prefix: {"revision": revision,
                     "records": [[k, base64.b64encode(v).decode("ascii"), rev] for k, (v, rev) in sorted(raw.items())]}
            for prefix, revision, raw in sources
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def parse(data: bytes, key: str, exact: bool, fmt: str, prefixes: Iterable[str]) -> CachedList:
    """A cache file's list for the subscription (key, exact, format) reading ``prefixes``; ``CacheError``
    saying why it cannot be used. Ranges in the file that the subscription does not read are left out;
    ranges it reads that the file lacks come out empty."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CacheError(f"not a waypost cache file (not JSON: {_short(e)})") from None
    if not isinstance(doc, dict) or doc.get("waypost") != MAGIC:
        raise CacheError("not a waypost cache file")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:
        raise CacheError(f"cache format version {_short(version)} (this waypost reads version {VERSION})")
    for name, want in (("key", key), ("exact", exact), ("format", fmt)):
        got = doc.get(name)
        if type(got) is not type(want) or got != want:
            raise CacheError(f"a cache file of another subscription ({name} {_short(got)}, expected {want!r})")
    written: Any = doc.get("written")
    if type(written) not in (int, float) or not math.isfinite(written):
        raise CacheError(f"bad 'written' time {_short(written)}")
    sources = doc.get("sources")
    if not isinstance(sources, dict):
        raise CacheError("no 'sources' object")
    out: dict[str, ValueColumns] = {}
    for prefix in prefixes:
        src = sources.get(prefix)
        out[prefix] = ValueColumns([], [], [], 0) if src is None else _source(prefix, src, exact)
    return CachedList(float(written), out)


def _source(prefix: str, src: Any, exact: bool) -> ValueColumns:
    if not isinstance(src, dict):
        raise CacheError(f"range {_short(prefix)}: not an object")
    revision = src.get("revision")
    if type(revision) is not int or revision < 0:
        raise CacheError(f"range {_short(prefix)}: bad revision {_short(revision)}")
    records = src.get("records")
    if not isinstance(records, list):
        raise CacheError(f"range {_short(prefix)}: no 'records' list")
    rows: dict[str, tuple[bytes, int]] = {}
    for rec in records:
        if not (isinstance(rec, list) and len(rec) == 3 and isinstance(rec[0], str) and isinstance(rec[1], str)
                and type(rec[2]) is int and 0 <= rec[2] <= revision):
            raise CacheError(f"range {_short(prefix)}: bad record {_short(rec)}")
        k, v, rev = rec
        if (k != prefix) if exact else (not k.startswith(prefix) or k == prefix):
            raise CacheError(f"range {_short(prefix)}: record key {_short(k)} outside the range")
        if k in rows:
            raise CacheError(f"range {_short(prefix)}: key {_short(k)} twice")
        try:
            rows[k] = (base64.b64decode(v.encode("ascii"), validate=True), rev)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise CacheError(f"range {_short(prefix)}: value of {_short(k)} is not base64") from None
    keys = sorted(rows)
    return ValueColumns(keys, [rows[k][0] for k in keys], [rows[k][1] for k in keys], revision)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read(path: str, key: str, exact: bool, fmt: str, prefixes: Iterable[str]) -> CachedList:
    """``parse`` of the file at ``path`` (``CacheError`` also when it cannot be read or is too big)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise CacheError(f"cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise CacheError(f"bigger than {MAX_BYTES} bytes")
    return parse(data, key, exact, fmt, prefixes)


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a temporary file in the same directory, then a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class CacheWriter:
    """Writes a subscription's list to ``path`` after changes, at most once per ``MIN_INTERVAL``, and
    at close. ``snapshot()`` gives the bytes to write, or None while there is nothing to write (a view
    still stale: it would only copy the cache or a stale read). Lives on the control loop."""

    def __init__(self, path: str, snapshot: Callable[[], bytes | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.snapshot = snapshot
        self.clock = clock
        self.writes = 0
        self._last = -math.inf
        self._timer: Any = None
        self._dirty = False
        self._failing = False
        self._closed = False

    def changed(self) -> None:
        """Something changed: write now, or when ``MIN_INTERVAL`` has passed since the last write."""
        if self._closed:
            return
        self._dirty = True
        wait = self._last + MIN_INTERVAL - self.clock()
        if wait <= 0:
            self._write()
        elif self._timer is None:
            self._timer = _loop.get_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._dirty and not self._closed:
            self._write()

    def _write(self) -> None:
        try:
            data = self.snapshot()
        except Exception:  # a cache must never break the subscription
            log.exception("waypost: cache snapshot for %s failed", self.path)
            return
        if data is None:
            return
        self._dirty = False
        self._last = self.clock()
        try:
            write_atomic(self.path, data)
        except OSError as e:
            if not self._failing:
                self._failing = True
                log.warning("waypost: cannot write the discovery cache file %s: %s", self.path, e)
            return
        self.writes += 1
        if self._failing:
            self._failing = False
            log.info("waypost: discovery cache file %s written again", self.path)

    def close(self) -> None:
        """The last write (if anything is to be written), then no more."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._write()
        self._closed = True
