"""waypost's own etcd v3 client (grpc.aio, our wire-compatible proto subset) and local etcd launcher."""

from __future__ import annotations

from .client import EtcdClient
from .config import EtcdConfig
from .keys import decode_key, encode_key, key_range, prefix_range_end

__all__ = ["EtcdClient", "EtcdConfig", "decode_key", "encode_key", "key_range", "prefix_range_end"]
