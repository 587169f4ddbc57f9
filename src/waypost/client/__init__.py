"""The core shared by the sync and aio balanced channels (the layer below ``waypost.channel`` / ``waypost.aio``):
subconns, the balancer and picker wrappers (grpc-go's), the multicallables of both channels side by side, retries,
hedging and replay. Each module's docstring says its one job; docs/architecture.md says where each concept lives.
"""
