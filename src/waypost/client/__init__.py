"""The core shared by the sync and aio balanced channels (the layer below ``waypost.channel`` / ``waypost.aio``).

- ``channel_base``: what the sync and aio channels share (``ChannelBase``: target, config, backend channel
  arguments, the health service, and the properties a multicallable reads).
- ``subconn``: one backend address = one real grpc channel + its connectivity, health and in-flight count.
- ``subconn_pool``: the subconn lifecycle: created per new address, drained after removal, revived, closed.
- ``balancer_wrapper``: resolver updates, the subconn set, connectivity and health tracking, picker rebuilds
  (grpc-go's balancer wrapper).
- ``picker_wrapper``: the current picker snapshot, the pick, waiting for a pick, and the error text of a call
  that cannot get one (grpc-go's picker wrapper).
- ``method``: what a multicallable knows of its method (shared by both channels), the ``BalancedChannel``
  interface it sees of its channel, the four multicallable makers, and an attempt's two ends (``begin``: the
  pick, the in-flight count, the start time; ``finish``: the outcome).
- ``sync_unary_calls`` / ``sync_stream_calls`` and ``aio_unary_calls`` / ``aio_stream_calls`` (+ ``aio_call_base``):
  the multicallables of the sync and aio channels, side by side; ``aio_wait``: an aio call waiting for a usable
  backend (the sync one waits in ``picker_wrapper``).
- ``retry``: retry state, where a retry goes, the retry policy's backoff; ``replay`` / ``aio_replay``: the
  requests of a client stream kept for another attempt; ``retrying_stream``: the sync response stream that retries;
  ``retry_throttle``: gRPC's retry throttling.
- ``live``: the live balancer wrappers, what happens to them in a forked child (the after-fork hook), and the
  metrics gauges read from them.
- ``watcher``: one shared thread polling every sync backend channel's connectivity (no thread per backend).
- ``health``: grpc.health.v1 Watch per backend, as coroutines.
- ``rpcerror``: grpc.RpcError values raised by the balancer itself (no READY backend, picker errors).
- ``channel_args``: default per-backend channel arguments (local subchannel pool, keepalive, no native retries).
- ``dial_options``: what ``dial`` / ``aio.dial`` take (``DialOptions``); ``channel_config``: what ``dial`` decides
  from them once per channel (``ChannelConfig``: target, policy, per-method settings, throttling, health).
"""
