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

__all__ = [
    "Compacted",
    "InvalidServiceConfig",
    "InvalidTarget",
    "NoBackendAvailable",
    "PermissionDenied",
    "RegistryError",
    "RegistryUnavailable",
    "WaypostError",
    "__version__",
]
