"""waypost: service registration, discovery and client-side load balancing for Python gRPC.

The public API is re-exported here; everything else is private by convention.
"""

from __future__ import annotations

from .errors import (
    Compacted,
    InvalidServiceConfig,
    InvalidTarget,
    NoBackendAvailable,
    PermissionDenied,
    RegistryError,
    RegistryUnavailable,
    WaypostError,
)

__version__ = "0.1.0"

# Public names that live in heavier modules are imported on first use, so `import waypost` stays cheap
# and a missing optional piece never breaks the rest.
_LAZY = {
    "connect": ("waypost.registry", "connect"),
    "Registry": ("waypost.registry.base", "Registry"),
    "Publisher": ("waypost.discovery", "Publisher"),
    "Subscriber": ("waypost.discovery", "Subscriber"),
    "serve": ("waypost.server", "serve"),
    "serve_async": ("waypost.server", "serve_async"),
    "dial": ("waypost.channel", "dial"),
    "hash_key": ("waypost.client.hashkey", "hash_key"),
    "parse_service_config": ("waypost.service_config", "parse_service_config"),
    "parse_target": ("waypost.resolver.target", "parse_target"),
    "Backend": ("waypost.types", "Backend"),
    "set_load": ("waypost.loadreport", "set_load"),
    "load_interceptor": ("waypost.loadreport", "load_interceptor"),
}


def __getattr__(name: str) -> object:
    if name == "aio":
        import importlib

        return importlib.import_module("waypost.aio")
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'waypost' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value

__all__ = [
    "Backend",
    "Compacted",
    "InvalidServiceConfig",
    "InvalidTarget",
    "NoBackendAvailable",
    "PermissionDenied",
    "Publisher",
    "Registry",
    "RegistryError",
    "RegistryUnavailable",
    "Subscriber",
    "WaypostError",
    "__version__",
    "aio",
    "connect",
    "dial",
    "hash_key",
    "load_interceptor",
    "parse_service_config",
    "parse_target",
    "serve",
    "serve_async",
    "set_load",
]
