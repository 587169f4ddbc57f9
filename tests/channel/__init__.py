"""Balanced channels (sync and aio): calls, retries, routing, lifecycle, metrics; with real gRPC servers."""
