"""The native path: gRPC's own xDS client balancing over waypost's discovery, with no Python per call.

``channel("greeter", {"greeter": "etcd:///127.0.0.1:2379?key=greet.rpc"})`` starts (once per process) a
control plane on a loopback port, inside this process, over waypost's resolvers; points gRPC at it by
setting ``GRPC_XDS_BOOTSTRAP_CONFIG``; and returns a plain ``grpc.Channel`` on ``xds:///greeter``. From then
on every call is picked by gRPC's C core (round_robin, ring_hash, ... as the export says), while waypost's
resolvers follow the registry and push endpoint changes over xDS.

**The bootstrap constraint**: gRPC reads its xDS bootstrap when it creates its xDS client, which every
``xds:///`` channel of the process then shares. So the variable must be set before the first xds channel,
and one process talks to one set of control planes. ``start_local`` therefore refuses (``XdsBootstrapConflict``)
when ``GRPC_XDS_BOOTSTRAP`` or ``GRPC_XDS_BOOTSTRAP_CONFIG`` already names another control plane: xds channels
made with that bootstrap would not see these exports. (A channel made before any bootstrap was set fails
by itself and is not remembered: gRPC retries with the new variable.) Further exports are added to the same
local control plane.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from ..errors import WaypostError
from .bootstrap import bootstrap_json
from .control import ControlPlane
from .exports import Export, make_export, parse_export

log = logging.getLogger("waypost.xds")

ENV_CONFIG = "GRPC_XDS_BOOTSTRAP_CONFIG"
ENV_FILE = "GRPC_XDS_BOOTSTRAP"
#: what ``exports=`` accepts: {name: target or {target=..., options}}, or "NAME=TARGET [OPT=V ...]" strings / Exports
Exports = Mapping[str, Any] | Iterable[str | Export] | None

_lock = threading.Lock()
_local: LocalControlPlane | None = None


class XdsBootstrapConflict(WaypostError, RuntimeError):
    """The process already has an xDS bootstrap naming another control plane."""


class LocalControlPlane:
    """The in-process control plane of ``start_local``: ``address``, ``bootstrap`` (the JSON set in the
    environment), ``control`` (the ``ControlPlane``), ``add(exports)``, ``close()``."""

    def __init__(self, control: ControlPlane, address: str, bootstrap: str) -> None:
        self.control = control
        self.address = address
        self.bootstrap = bootstrap

    @property
    def names(self) -> list[str]:
        return sorted(self.control.exports)

    def add(self, exports: Exports) -> None:
        for e in to_exports(exports):
            self.control.add_export(e)

    def close(self) -> None:
        """Stop serving (xds channels keep their last configuration) and forget this control plane."""
        global _local
        with _lock:
            if _local is self:
                _local = None
                if os.environ.get(ENV_CONFIG) == self.bootstrap:
                    del os.environ[ENV_CONFIG]
        self.control.stop()


def to_exports(exports: Exports) -> list[Export]:
    if exports is None:
        return []
    out: list[Export] = []
    if isinstance(exports, Mapping):
        for name, body in exports.items():
            if isinstance(body, Mapping):
                opts = {k: v for k, v in body.items() if k != "target"}
                out.append(make_export(name, body.get("target"), opts))
            else:
                out.append(make_export(name, body, {}))
        return out
    for item in exports:
        out.append(item if isinstance(item, Export) else parse_export(item))
    return out


def start_local(exports: Exports = None) -> LocalControlPlane:
    """The process's local control plane, started on first use (module docstring), with ``exports`` added."""
    global _local
    wanted = to_exports(exports)
    with _lock:
        if _local is None:
            mine = os.environ.get(ENV_CONFIG)
            other = os.environ.get(ENV_FILE) or mine
            if other:
                raise XdsBootstrapConflict(
                    f"this process already has an xDS bootstrap ({ENV_FILE if os.environ.get(ENV_FILE) else ENV_CONFIG}"
                    " is set), and gRPC shares one xDS client per process: waypost's local control plane cannot "
                    "be added. Unset the variable before any xds:/// channel is made, or export these services "
                    "from that control plane (waypost xds serve).")
            control = ControlPlane(wanted)
            port = control.start("127.0.0.1:0")
            address = f"127.0.0.1:{port}"
            text = bootstrap_json([address], f"waypost-local-{os.getpid()}")
            os.environ[ENV_CONFIG] = text
            _local = LocalControlPlane(control, address, text)
            log.info("xds: local control plane on %s (%s)", address, ", ".join(sorted(control.exports)) or "no export")
            return _local
        local = _local
    local.add(wanted)
    return local


def _target(name: str, exports: Exports) -> str:
    local = start_local(exports)
    if name not in local.control.exports and not any(e.name == name for e in to_exports(exports)):
        raise WaypostError(f"xds: {name!r} is not exported (exported: {', '.join(local.names) or 'none'}); "
                           f"pass exports={{{name!r}: TARGET}}")
    return f"xds:///{name}"


def channel(name: str, exports: Exports = None, *, options: Iterable[tuple[str, Any]] = (),
            credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A plain ``grpc.Channel`` on ``xds:///name``, balanced by gRPC over waypost's discovery (module docstring).

    ``exports`` adds services to the local control plane (``{name: target}``, ``"NAME=TARGET OPT=V"`` strings or
    ``Export`` objects); ``name`` must be one of the exported services."""
    target = _target(name, exports)
    opts = list(options)
    return grpc.secure_channel(target, credentials, opts) if credentials else grpc.insecure_channel(target, opts)


def aio_channel(name: str, exports: Exports = None, *, options: Iterable[tuple[str, Any]] = (),
                credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """``channel`` for asyncio: a plain ``grpc.aio.Channel`` on ``xds:///name``."""
    target = _target(name, exports)
    opts = list(options)
    if credentials:
        return grpc.aio.secure_channel(target, credentials, opts)
    return grpc.aio.insecure_channel(target, opts)
