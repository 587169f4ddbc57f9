"""waypost: service registration, discovery and client-side load balancing for Python gRPC.

The public API is re-exported here; everything else is private by convention.

Servers: ``serve`` / ``serve_async`` (bind, start, register, drain on SIGTERM), or ``Publisher`` by hand;
every registration (``Publisher``, ``ConsulPublisher``, ``ZkPublisher``, ``EurekaPublisher``, ``MultiPublisher``) is a
``Registration``.
Clients: ``dial`` (a ``grpc.Channel``), ``aio.dial`` (a ``grpc.aio.Channel``), ``hash_key``; ``Subscriber``
for the raw backend list. Registries: ``connect``. Errors: ``WaypostError`` and its subclasses; valid but
suspicious configuration (a service-config name matching no method, ...) is a ``ConfigWarning``. Custom load-balancing policies: ``Policy``, ``Picker``,
``PickInfo``, ``PickResult``, ``Outcome``, ``PickError``, ``register_policy`` (docs/custom-policies.md).
Registry kinds of one's own: ``RegistryKind``, ``register_kind`` or the ``waypost.registries`` entry points
(docs/registry-kinds.md).
gRPC's own xDS clients over waypost's discovery: ``waypost.xds`` (``xds.channel``, ``waypost xds serve``; docs/xds.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .errors import (
    Compacted,
    ConfigWarning,
    InvalidServiceConfig,
    InvalidTarget,
    NoBackendAvailable,
    PermissionDenied,
    RegistryError,
    RegistryUnavailable,
    WaypostError,
)


def _installed_version() -> str:
    """This package's version, from its installed metadata (pyproject.toml's ``version``: the one place it is set).
    A source tree on ``sys.path`` without an install has no metadata: ``"0+unknown"`` then, which sorts before
    every release."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("waypost")
    except PackageNotFoundError:
        return "0+unknown"


__version__: str = _installed_version()
"""The installed waypost's version (PEP 440), e.g. ``"0.1.0"``."""

# A library never prints by itself: without this, Python's last-resort handler writes our warnings to
# stderr when the application configured no logging. Configure logging to see them (docs/operations.md).
logging.getLogger("waypost").addHandler(logging.NullHandler())

# Type checkers see the real names; at run time the heavier modules are imported on first use (``_LAZY``),
# so ``import waypost`` stays cheap and a missing optional piece never breaks the rest. The two lists are
# kept in step by tests/project/test_public_api.py.
if TYPE_CHECKING:
    from . import aio as aio
    from . import orca as orca
    from . import xds as xds
    from .balancer.base import Outcome as Outcome
    from .balancer.base import Picker as Picker
    from .balancer.base import PickError as PickError
    from .balancer.base import PickInfo as PickInfo
    from .balancer.base import PickResult as PickResult
    from .balancer.base import Policy as Policy
    from .balancer.policies import register_policy as register_policy
    from .channel import dial as dial
    from .client.dial_options import DialKeywords as DialKeywords
    from .client.dial_options import DialOptions as DialOptions
    from .client.hashkey import hash_key as hash_key
    from .discovery import Subscriber as Subscriber
    from .discovery.connections import connect as connect
    from .discovery.store import Registry as Registry
    from .kind_table import RegistryKind as RegistryKind
    from .kind_table import register_kind as register_kind
    from .orca import load_interceptor as load_interceptor
    from .orca import set_load as set_load
    from .registration.contract import Registration as Registration
    from .registration.factory import MultiPublisher as MultiPublisher
    from .registries.consul.registrar import ConsulPublisher as ConsulPublisher
    from .registries.etcd.registrar import Publisher as Publisher
    from .registries.eureka.registrar import EurekaPublisher as EurekaPublisher
    from .registries.zookeeper.registrar import ZkPublisher as ZkPublisher
    from .resolver.target import parse_target as parse_target
    from .server import AsyncServeHandle as AsyncServeHandle
    from .server import BindError as BindError
    from .server import ServeHandle as ServeHandle
    from .server import ServeKeywords as ServeKeywords
    from .server import ServeOptions as ServeOptions
    from .server import serve as serve
    from .server import serve_async as serve_async
    from .service_config import parse_service_config as parse_service_config
    from .types import Backend as Backend

_LAZY = {
    "aio": ("waypost.aio", None),
    # gRPC's own xDS clients over waypost's discovery (the xds extra): waypost.xds.channel, ControlPlane, ...
    "xds": ("waypost.xds", None),
    # ORCA load reports (the xds extra): waypost.orca.server_recorder(handle), call_recorder(context), ...
    "orca": ("waypost.orca", None),
    "connect": ("waypost.discovery.connections", "connect"),
    "Registry": ("waypost.discovery.store", "Registry"),
    # registry kinds as plug-ins (docs/registry-kinds.md)
    "RegistryKind": ("waypost.kind_table", "RegistryKind"),
    "register_kind": ("waypost.kind_table", "register_kind"),
    "Publisher": ("waypost.registries.etcd.registrar", "Publisher"),
    "ConsulPublisher": ("waypost.registries.consul.registrar", "ConsulPublisher"),
    "ZkPublisher": ("waypost.registries.zookeeper.registrar", "ZkPublisher"),
    "EurekaPublisher": ("waypost.registries.eureka.registrar", "EurekaPublisher"),
    "MultiPublisher": ("waypost.registration.factory", "MultiPublisher"),
    "Registration": ("waypost.registration.contract", "Registration"),
    "Subscriber": ("waypost.discovery", "Subscriber"),
    "serve": ("waypost.server", "serve"),
    "serve_async": ("waypost.server", "serve_async"),
    "ServeHandle": ("waypost.server", "ServeHandle"),
    "AsyncServeHandle": ("waypost.server", "AsyncServeHandle"),
    "BindError": ("waypost.server", "BindError"),
    "ServeOptions": ("waypost.server", "ServeOptions"),
    "ServeKeywords": ("waypost.server", "ServeKeywords"),
    "dial": ("waypost.channel", "dial"),
    "DialOptions": ("waypost.client.dial_options", "DialOptions"),
    "DialKeywords": ("waypost.client.dial_options", "DialKeywords"),
    "hash_key": ("waypost.client.hashkey", "hash_key"),
    "parse_service_config": ("waypost.service_config", "parse_service_config"),
    "parse_target": ("waypost.resolver.target", "parse_target"),
    "Backend": ("waypost.types", "Backend"),
    "set_load": ("waypost.orca", "set_load"),
    "load_interceptor": ("waypost.orca", "load_interceptor"),
    # the policy contract; register_policy from ``policies`` so the built-ins are registered first
    "Policy": ("waypost.balancer.base", "Policy"),
    "Picker": ("waypost.balancer.base", "Picker"),
    "PickInfo": ("waypost.balancer.base", "PickInfo"),
    "PickResult": ("waypost.balancer.base", "PickResult"),
    "PickError": ("waypost.balancer.base", "PickError"),
    "Outcome": ("waypost.balancer.base", "Outcome"),
    "register_policy": ("waypost.balancer.policies", "register_policy"),
}


def __getattr__(name: str) -> object:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'waypost' has no attribute {name!r}") from None
    import importlib

    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AsyncServeHandle",
    "Backend",
    "BindError",
    "Compacted",
    "ConfigWarning",
    "ConsulPublisher",
    "DialKeywords",
    "DialOptions",
    "EurekaPublisher",
    "InvalidServiceConfig",
    "InvalidTarget",
    "MultiPublisher",
    "NoBackendAvailable",
    "Outcome",
    "PermissionDenied",
    "PickError",
    "PickInfo",
    "PickResult",
    "Picker",
    "Policy",
    "Publisher",
    "Registration",
    "Registry",
    "RegistryError",
    "RegistryKind",
    "RegistryUnavailable",
    "ServeHandle",
    "ServeKeywords",
    "ServeOptions",
    "Subscriber",
    "WaypostError",
    "ZkPublisher",
    "__version__",
    "aio",
    "connect",
    "dial",
    "hash_key",
    "load_interceptor",
    "orca",
    "parse_service_config",
    "parse_target",
    "register_kind",
    "register_policy",
    "serve",
    "serve_async",
    "set_load",
    "xds",
]
