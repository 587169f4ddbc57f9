"""The core shared by the sync and aio balanced channels.

- ``subconn``: one backend address = one real grpc channel + its connectivity, health and in-flight count.
- ``core``: the ``Balancer``: the backend set, READY tracking, picker swaps, and the "is anything still
  connecting?" question behind wait-for-ready.
- ``watcher``: one shared thread polling every sync backend channel's connectivity (no thread per backend).
- ``health``: grpc.health.v1 Watch per backend, as coroutines.
- ``rpcerror``: grpc.RpcError values raised by the balancer itself (no READY backend, picker errors).
- ``options``: default per-backend channel options (local subchannel pool, keepalive, no native retries).
"""
