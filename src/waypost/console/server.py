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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..discovery.connections import connect
from ..discovery.store import Registry
from ..kind_table import all_kinds, kind_of, part
from ..netutil import split_host_port
from ..redaction import redact_url
from .board import Board
from .clients import ClientMetrics
from .probe import HealthProber
from .sources import TargetSource, on_control
from .web import is_loopback, make_app
from .xds_clients import XdsClients

log = logging.getLogger("waypost.console")

DEFAULT_LISTEN = "127.0.0.1:8470"
#: seconds requests still running get when the console stops
SHUTDOWN_TIMEOUT = 2.0


def _shown(registry: str | Registry) -> str:
    return redact_url(registry) if isinstance(registry, str) else registry.url


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
    #: an xDS control plane (HOST:PORT) whose clients the page lists, from its client status service
    xds: str | None = None
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
        #: every registry shown, each followed by its kind's console source (a ``Registry`` object: its URL's kind)
        self.registry_urls: list[str | Registry] = []
        for r in config.registries:
            kind = kind_of(r if isinstance(r, str) else r.url)
            if kind is None and isinstance(r, str):
                connect(r)  # raises InvalidTarget naming the scheme it does not know
            if kind is None or kind.console_source is None:
                listed = ", ".join(f"{k.scheme}://" for k in all_kinds().values() if k.console_source)
                title, example = (kind.title, kind.target_example) if kind else ("", "")
                raise ValueError(f"{redact_url(str(r))}: the console lists {listed} registries; show a "
                                 f"{title} service with --target {example}")
            if kind.keyed and isinstance(r, str):
                part(kind, "parse_url")(r)  # a malformed URL fails here, not once the console starts
            self.registry_urls.append(r)
        self.board: Board | None = None
        self._sources: list[Any] = []
        self._store_sources: list[Any] = []
        self._prober: HealthProber | None = None
        self._metrics: ClientMetrics | None = None
        self.xds_clients: XdsClients | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- what web.py asks ----------------------------------------------------------------------------

    on_control = staticmethod(on_control)

    def source_names(self) -> list[str]:
        names = [s.name for s in self._store_sources] or [_shown(r) for r in self.registry_urls]
        return names + [redact_url(t) for t in self.config.targets]

    def writable(self) -> list[tuple[str, Any]]:
        """(name, store) of every registry the console's actions may write: each console source's ``writer`` (a keyed
        registry itself, Consul's KV, ZooKeeper's znodes; None: read only)."""
        return [(c.name, c.writer) for c in self._store_sources if c.writer is not None]

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
            for r in self.registry_urls:
                kind = kind_of(r if isinstance(r, str) else r.url)
                assert kind is not None  # sorted in __init__
                ssrc = part(kind, "console_source")(r, board, self.config.timeout)
                self._sources.append(ssrc)
                self._store_sources.append(ssrc)
                await ssrc.start()
            for t in self.config.targets:
                tsrc = TargetSource(t, board, self.config.timeout)
                self._sources.append(tsrc)
                await tsrc.start()
            self._prober = HealthProber(board, interval=self.config.health_interval)
            self._prober.start()
            self._metrics = ClientMetrics(board, list(self.config.metrics), interval=self.config.metrics_interval)
            self._metrics.start()
            if self.config.xds:
                self.xds_clients = XdsClients(self.config.xds, timeout=self.config.timeout)
                self.xds_clients.start()
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
        addresses = self._runner.addresses  # the bound (host, port, ...) of its one site: port 0 asked for any
        port = addresses[0][1] if addresses else self.port
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
        for closer in (self._prober, self._metrics, self.xds_clients, *self._sources):
            if closer is not None:
                try:
                    await closer.close()
                except Exception:  # stop everything else anyway
                    log.debug("console: closing %r failed", closer, exc_info=True)
        self._sources = []
        self._store_sources = []

    def run(self, stop: threading.Event, started: Callable[[str], object] | None = None) -> None:
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
