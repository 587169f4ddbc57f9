"""Consul: the agent settings (``ConsulConfig``, ``consul://`` registry URLs), a small asyncio client of its HTTP
API (``api``, on aiohttp: the ``consul`` extra); ``registrar`` registers with it, ``discovery`` discovers with it,
``overrides`` keeps the operator's overrides in its KV store, ``console`` shows it (docs/consul.md)."""

from __future__ import annotations

from .config import CONSUL_DEFAULT_PORT, ConsulConfig, from_target, parse_registry_url

__all__ = ["CONSUL_DEFAULT_PORT", "ConsulConfig", "from_target", "parse_registry_url"]
