"""waypost as an xDS control plane: gRPC's own xDS clients (grpcio, grpc-go, grpc-java) balance over waypost's
discovery (docs/xds.md).

- ``ControlPlane(exports, prefixes)``: an Aggregated Discovery Service (xDS v3, state of the world) serving,
  per exported service NAME, Listener / RouteConfiguration / Cluster / ClusterLoadAssignment NAME, fed by
  waypost's resolvers (``waypost xds serve`` runs one);
- ``channel`` / ``aio_channel`` / ``start_local``: the same in-process, and a plain gRPC channel on
  ``xds:///NAME`` (``local.py``: gRPC balances with no Python per call);
- ``parse_export``, ``load_config``, ``bootstrap``: exports, config files, the client bootstrap.

Needs the ``xds`` extra (``pip install 'waypost[xds]'``: the ``xds-protos`` package).
"""

from __future__ import annotations

try:
    import envoy.service.discovery.v3.ads_pb2  # noqa: F401  (the protos every module here builds on)
except ImportError as e:  # one clear line instead of "No module named 'envoy'" from deep inside
    raise ImportError(f"waypost.xds needs the xds extra: pip install 'waypost[xds]' ({e})", name=e.name) from e

from .bootstrap import bootstrap, bootstrap_json
from .control import ControlPlane
from .errors import XdsConfigError
from .exports import Export, PrefixExport, XdsConfig, load_config, parse_config, parse_export
from .local import LocalControlPlane, XdsBootstrapConflict, aio_channel, channel, start_local

__all__ = [
    "ControlPlane",
    "Export",
    "LocalControlPlane",
    "PrefixExport",
    "XdsBootstrapConflict",
    "XdsConfig",
    "XdsConfigError",
    "aio_channel",
    "bootstrap",
    "bootstrap_json",
    "channel",
    "load_config",
    "parse_config",
    "parse_export",
    "start_local",
]
