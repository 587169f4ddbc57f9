"""Consul: the agent settings (``ConsulConfig``, ``consul://`` registry URLs) and a small asyncio client of its
HTTP API (``ConsulClient``, on aiohttp: the ``consul`` extra); ``publisher`` registers with it, ``resolver``
discovers with it, ``console`` shows it (docs/consul.md)."""

from __future__ import annotations

from .config import CONSUL_DEFAULT_PORT, ConsulConfig, from_target, parse_registry_url, resolve_config

__all__ = ["CONSUL_DEFAULT_PORT", "ConsulConfig", "from_target", "parse_registry_url", "resolve_config"]
