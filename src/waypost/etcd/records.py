"""The KeyValue records of a serialized RangeResponse, read as columns instead of one message each.

Reading a field of a protobuf message from Python costs about as much as building a small object,
so a prefix read of 1,000 keys spent most of its time in 6,000 attribute reads. Two views of the
same bytes avoid that (wire-compatible, built at import in a private descriptor pool so they never
meet the generated classes or another etcd library):

- ``_RangeHead`` reads the header revision, ``count``, and each record as unparsed bytes: cheap,
  and enough for ``len`` and for callers that never look at the records.
- ``_RangeColumns`` declares ``kvs`` (field 2) as ONE message of repeated fields. Protobuf merges
  repeated occurrences of a singular message field, and merging concatenates repeated fields, so
  one parse yields six parallel lists (keys, create revisions, ...) filled in C.

proto3 leaves zero/empty fields off the wire, so a column is only usable if it lines up with the
records: etcd always sends key, create_revision, mod_revision and version (all non-zero for a live
key), while value and lease are absent when empty/zero. A value or lease column with every record
or with none lines up; a mix (some keys leased, some not) does not, and ``columns`` returns None so
the caller reads the records one message at a time (``messages``). etcd, like any canonical encoder,
writes each field of a record at most once, which is what makes a full-length column line up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ..errors import RegistryError
from ._generated import waypost_etcd_pb2 as pb

M = TypeVar("M")

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "waypost.etcdrecords"


def _build_classes() -> tuple[Any, Any]:
    f = descriptor_pb2.FileDescriptorProto(name="waypost_etcd_records.proto", package=_PACKAGE,
                                           syntax="proto3")

    def add(msg: Any, name: str, number: int, kind: int, repeated: bool = False, type_name: str = "") -> None:
        field = msg.field.add(name=name, number=number, type=kind,
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
        if type_name:
            field.type_name = type_name

    header = f.message_type.add(name="Header")  # etcd ResponseHeader: only the revision is read
    add(header, "revision", 3, _F.TYPE_INT64)
    head = f.message_type.add(name="RangeHead")  # etcd RangeResponse with the records left unparsed
    add(head, "header", 1, _F.TYPE_MESSAGE, type_name=f".{_PACKAGE}.Header")
    add(head, "kvs", 2, _F.TYPE_BYTES, repeated=True)
    add(head, "more", 3, _F.TYPE_BOOL)
    add(head, "count", 4, _F.TYPE_INT64)
    cols = f.message_type.add(name="KeyValueColumns")  # etcd mvccpb.KeyValue, every field repeated
    for name, number, kind in (("key", 1, _F.TYPE_BYTES), ("create_revision", 2, _F.TYPE_INT64),
                               ("mod_revision", 3, _F.TYPE_INT64), ("version", 4, _F.TYPE_INT64),
                               ("value", 5, _F.TYPE_BYTES), ("lease", 6, _F.TYPE_INT64)):
        add(cols, name, number, kind, repeated=True)
    rc = f.message_type.add(name="RangeColumns")  # etcd RangeResponse, all records merged into one
    add(rc, "kvs", 2, _F.TYPE_MESSAGE, type_name=f".{_PACKAGE}.KeyValueColumns")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.RangeHead")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.RangeColumns")))


_RangeHead, _RangeColumns = _build_classes()


class Head(NamedTuple):
    """What a Range answered, without parsing its records."""

    revision: int  # header revision
    total: int  # RangeResponse.count: keys in the range (more than ``records`` with a limit)
    records: int  # KeyValue records in this response


class Columns(NamedTuple):
    """The records of a Range response as parallel sequences, in key order."""

    keys: list[str]  # decoded like keys.decode_key: UTF-8, undecodable bytes kept via surrogateescape
    values: list[bytes]
    create_revisions: list[int]
    mod_revisions: list[int]
    versions: list[int]
    leases: list[int]


def parse(cls: type[M], data: bytes) -> M:
    """``cls.FromString(data)``; a malformed response raises RegistryError (as gRPC would have)."""
    try:
        return cls.FromString(data)  # type: ignore[attr-defined]
    except DecodeError as e:
        raise RegistryError(f"etcd get: malformed Range response ({len(data)} bytes): {e}") from None


def head(data: bytes) -> Head:
    """Header revision, count and number of records of a serialized RangeResponse."""
    h = parse(_RangeHead, data)
    return Head(h.header.revision, h.count, len(h.kvs))


def decode_keys(raw: Sequence[bytes]) -> list[str]:
    """Keys as registry strings, all at once (strict UTF-8 is faster, and equal wherever it succeeds)."""
    try:
        return list(map(bytes.decode, raw))
    except UnicodeDecodeError:
        return [k.decode("utf-8", "surrogateescape") for k in raw]


def _column(col: Any, n: int, empty: Any) -> list[Any] | None:
    """A value or lease column as a list of n, or None when only some records have the field."""
    size = len(col)
    if size == n:
        return col[:]
    if size == 0:
        return [empty] * n
    return None


def columns(data: bytes, records: int) -> Columns | None:
    """The ``records`` records of a serialized RangeResponse as columns, or None if they do not line
    up (a value or lease on only some records, or a record missing a field etcd always sends)."""
    if records == 0:
        return Columns([], [], [], [], [], [])
    c = parse(_RangeColumns, data).kvs
    if not len(c.key) == len(c.create_revision) == len(c.mod_revision) == len(c.version) == records:
        return None
    values = _column(c.value, records, b"")
    leases = _column(c.lease, records, 0)
    if values is None or leases is None:
        return None
    # a slice is a list made in one C call; zip/map over the containers themselves is much slower
    return Columns(decode_keys(c.key[:]), values, c.create_revision[:], c.mod_revision[:], c.version[:], leases)


def messages(data: bytes) -> Sequence[Any]:
    """The records as KeyValue messages: the general path when ``columns`` says None."""
    return parse(pb.RangeResponse, data).kvs
