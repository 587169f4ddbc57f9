"""``waypost xds serve --engine native``: the ADS streams served by ``waypost_xds_engine`` (native/xds-engine, Rust:
tonic on tokio) instead of grpc.aio, the control plane unchanged.

``NativeAdsServer`` stands where ``server.AdsServer`` stands in ``ControlPlane``: each push hands the engine the
resources that changed, as the snapshot holds them (encoded Anys), with a content-hashed version per type (so
replicas serving the same registry agree); the engine keeps the streams, their subscriptions, nonces and
ACK/NACK state, and writes to the streams subscribed to a changed name.

What the default engine does and this one does not: TLS, ``--workers`` (a shared port), client status (CSDS) on
the ADS port (``waypost xds status`` is answered UNIMPLEMENTED), the placeholder Listener that fails calls to a
name not exported at once (the client waits for its does-not-exist timer instead), jitter on
``--max-connection-age``, and the stream and NACK metrics. Asking for the first two is an error naming them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import grpc

from .errors import XdsConfigError
from .resources import TYPES
from .snapshot import Snapshot

MODULE = "waypost_xds_engine"
INSTALL = ("install it with `pip install ./native/xds-engine` from waypost's repository (needs Rust's cargo), or "
           "use the default engine (--engine python)")


def available() -> bool:
    return importlib.util.find_spec(MODULE) is not None


def _version(type_url: str, snap: Snapshot) -> str:
    h = hashlib.sha256(type_url.encode())
    for name, r in sorted(snap.names(type_url).items()):
        h.update(name.encode() + b"\0" + r.digest)
    return h.hexdigest()[:16]


class NativeAdsServer:
    """The ADS service of ``ControlPlane`` on the native engine (module docstring)."""

    def __init__(self) -> None:
        try:
            engine_module: Any = importlib.import_module(MODULE)
        except ImportError as e:
            raise XdsConfigError(f"--engine native: the native engine ({MODULE}) is not installed ({e}); "
                                 f"{INSTALL}") from None
        self.engine = engine_module.Engine()
        self.port = 0
        self.nacks = 0
        self._set: set[str] = set()  # types handed over whole once (a type never set is never answered)

    async def start(self, listen: str, credentials: grpc.ServerCredentials | None = None, *,
                    reuse_port: bool = False, max_connection_age: float | None = None) -> int:
        if credentials is not None:
            raise XdsConfigError("--engine native serves plaintext only: drop --tls-cert/--tls-key/--client-ca, or "
                                 "use the default engine (--engine python)")
        if reuse_port:
            raise XdsConfigError("--engine native runs in one process: drop --workers (its tokio threads use every "
                                 "core), or use the default engine (--engine python)")
        try:
            self.port = int(self.engine.start(listen, max_connection_age=max_connection_age))
        except ValueError as e:
            raise OSError(str(e)) from None
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        self.engine.stop()

    def push(self, snap: Snapshot, changed: Mapping[str, AbstractSet[str]] | None = None) -> int:
        """Hand the engine what ``snap`` changed (``changed``: type URL -> names added, changed or removed; None:
        everything); returns the number of streams the engine pushes to."""
        reached = 0
        for type_url in TYPES if changed is None else changed:
            have = snap.names(type_url)
            version = _version(type_url, snap)
            if changed is None or type_url not in self._set:
                self._set.add(type_url)
                reached += self.engine.set_resources(type_url, {n: r.any_bytes for n, r in have.items()}, version,
                                                     packed=True)
                continue
            names = changed[type_url]
            put = {n: have[n].any_bytes for n in names if n in have}
            gone = [n for n in names if n not in have]
            if put or gone:
                reached += self.engine.update_resources(type_url, put, gone, version=version, packed=True)
        return reached

    def streams(self) -> list[dict[str, Any]]:
        """The engine's view of each open stream (node, per type: names, versions sent and ACKed, last NACK)."""
        return list(self.engine.streams())
