"""Consul: the agent settings (``ConsulConfig``, ``consul://`` registry URLs) and a small asyncio client of its
HTTP API (``ConsulClient``, on aiohttp: the ``consul`` extra). ``waypost.discovery.consul_publisher`` registers
with it and ``waypost.resolver.consul`` discovers with it (docs/consul.md)."""

from __future__ import annotations

from .config import CONSUL_DEFAULT_PORT, ConsulConfig, from_target, parse_registry_url, resolve_config

__all__ = ["CONSUL_DEFAULT_PORT", "ConsulConfig", "from_target", "parse_registry_url", "resolve_config"]
