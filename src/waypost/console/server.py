"""``Console``: the live web page of every service, instance and registry, with drain and weight controls.

One ``Console`` owns a board (``board.py``), its sources (``sources.py``: registries and targets), the health
prober (``probe.py``), the client metrics reader (``clients.py``) and aiohttp's web server (``web.py``), all on
one asyncio loop: ``await console.start()`` / ``await console.stop()``, or ``run(stop_event)`` from a thread.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..netutil import split_host_port
from ..redaction import redact_url
from ..registry import connect
from ..registry.base import Registry
from ..registry.kinds import kind_of, plugin, scheme_of
from .board import Board
from .clients import ClientMetrics
from .consul_source import ConsulSource, is_consul
from .probe import HealthProber
from .sources import RegistrySource, TargetSource, on_control
from .web import is_loopback, make_app
from .zk_source import ZkSource
from .zk_store import is_zk

log = logging.getLogger("waypost.console")

DEFAULT_LISTEN = "127.0.0.1:8470"
#: seconds requests still running get when the console stops
SHUTDOWN_TIMEOUT = 2.0


def _has_package(url: object) -> bool:
    kind = kind_of(url) if isinstance(url, str) else None
    return kind is not None and kind.package is not None


@dataclass
class ConsoleConfig:
    registries: Sequence[str | Registry] = ()
    targets: Sequence[str] = ()
    metrics: Sequence[str] = ()
    listen: str = DEFAULT_LISTEN
    token: str | None = None
    read_only: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    timeout: float = 5.0
    health_interval: float = 3.0
    metrics_interval: float = 2.0
    extra: dict[str, Any] = field(default_factory=dict)


class Console:
    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.token = config.token or secrets.token_urlsafe(24)
        self.read_only = config.read_only
        self.timeout = config.timeout
        host, port = split_host_port(config.listen, what="--listen", listen=True)
        self.host = host or "127.0.0.1"
        self.port = port or 0
        self.loopback_only = is_loopback(self.host)
        if (config.tls_cert is None) != (config.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        for r in config.registries:
            if isinstance(r, str) and r.strip().lower().startswith("k8s://"):
                raise ValueError(f"{redact_url(r)}: the console lists etcd, memory, consul:// and zk:// registries; "
                                 "show a Kubernetes service with --target k8s://NAMESPACE/SERVICE:PORT")
        self.consul_urls = [r for r in config.registries if isinstance(r, str) and is_consul(r)]
        self.zk_urls = [r for r in config.registries if isinstance(r, str) and is_zk(r)]
        # kinds in a package of their own (Eureka) give their console source by name
        self.plugin_urls = [r for r in config.registries if isinstance(r, str) and _has_package(r)]
        self.registries: list[Registry] = [connect(r) if isinstance(r, str) else r for r in config.registries
                                           if not (is_consul(r) or is_zk(r) or _has_package(r))]
        self.board: Board | None = None
        self._sources: list[Any] = []
        self._store_sources: list[Any] = []  # ConsulSource, ZkSource, a kind package's console_source
        self._prober: HealthProber | None = None
        self._metrics: ClientMetrics | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- what web.py asks ----------------------------------------------------------------------------

    on_control = staticmethod(on_control)

    def source_names(self) -> list[str]:
        stores = self.consul_urls + self.zk_urls + self.plugin_urls
        return ([r.url for r in self.registries] + [redact_url(u) for u in stores]
                + [redact_url(t) for t in self.config.targets])

    def writable(self) -> list[tuple[str, Any]]:
        """(name, store) of every registry the console's actions may write: etcd and memory registries, the KV
        store of each Consul agent, ZooKeeper's override znodes."""
        return [(r.url, r) for r in self.registries] + [(c.name, c.writer) for c in self._store_sources]

    def metrics_urls(self) -> list[str]:
        return [redact_url(u) for u in self.config.metrics]

    def registries_for(self, key: str, address: str, source: str | None) -> list[tuple[str, Any]]:
        """Where an action on (key, address) goes: the registry named, else every registry showing that
        instance, else the first registry (a drain may come before the instance registers)."""
        writable = self.writable()
        if source is not None:
            return [(n, r) for n, r in writable if n == source]
        board = self.board
        showing = {s.source for s in board.services.values() if s.key == key and address in s.instances} \
            if board else set()
        return [(n, r) for n, r in writable if n in showing] or writable[:1]

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Start following every source and serve; returns the page's URL."""
        self.board = board = Board()
        try:
            for r in self.registries:
                src = RegistrySource(r, board)
                self._sources.append(src)
                await src.start()
            for url in self.consul_urls:
                csrc = ConsulSource(url, board, self.config.timeout)
                self._sources.append(csrc)
                self._store_sources.append(csrc)
                await csrc.start()
            for url in self.zk_urls:
                zsrc = ZkSource(url, board, self.config.timeout)
                self._sources.append(zsrc)
                self._store_sources.append(zsrc)
                await zsrc.start()
            for url in self.plugin_urls:
                psrc = plugin(str(scheme_of(url))).new_console_source(url, board, self.config.timeout)
                self._sources.append(psrc)
                self._store_sources.append(psrc)
                await psrc.start()
            for t in self.config.targets:
                tsrc = TargetSource(t, board, self.config.timeout)
                self._sources.append(tsrc)
                await tsrc.start()
            self._prober = HealthProber(board, interval=self.config.health_interval)
            self._prober.start()
            self._metrics = ClientMetrics(board, list(self.config.metrics), interval=self.config.metrics_interval)
            self._metrics.start()
            self._runner = web.AppRunner(make_app(self, board), access_log=None, handle_signals=False,
                                        shutdown_timeout=SHUTDOWN_TIMEOUT)
            await self._runner.setup()
            ctx = None
            if self.config.tls_cert:
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ctx.load_cert_chain(self.config.tls_cert, self.config.tls_key)
            site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ctx, reuse_address=True)
            await site.start()
        except BaseException:
            await self.stop()
            raise
        sockets = getattr(site._server, "sockets", None) or []
        port = sockets[0].getsockname()[1] if sockets else self.port
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if ctx else 'http'}://{shown}:{port}/"
        if not self.loopback_only:
            log.warning("the console listens on %s, which is not a loopback address: anyone who can reach it sees "
                        "every registration%s", self.url, "" if ctx else ", in clear text (no --tls-cert)")
        return self.url

    async def stop(self) -> None:
        if self.board is not None:  # open event streams end, so the server's shutdown does not wait on them
            self.board.closed = True
            self.board.touch()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for closer in (self._prober, self._metrics, *self._sources):
            if closer is not None:
                try:
                    await closer.close()
                except Exception:  # stop everything else anyway
                    log.debug("console: closing %r failed", closer, exc_info=True)
        self._sources = []
        self._store_sources = []

    def run(self, stop: threading.Event, started: Any = None) -> None:
        """Serve until ``stop`` is set (blocking; its own event loop). ``started(url)`` once it serves."""

        async def main() -> None:
            url = await self.start()
            try:
                if started is not None:
                    started(url)
                while not stop.is_set():
                    await asyncio.sleep(0.2)
            finally:
                await self.stop()

        asyncio.run(main())
