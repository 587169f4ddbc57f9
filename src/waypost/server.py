"""``serve()``: the server lifecycle -- bind, start, THEN register; drain and deregister on SIGTERM.

Start-up (go-zero registers before the server listens; we never advertise a port that is not open):

1. add grpc.health.v1 to the server (NOT_SERVING for now) -- it must be added before start;
2. bind ``listen_on`` (port 0: the real port is used) and work out the advertised address;
3. start the server;
4. register with a ``Publisher`` under a lease (``RegistryUnavailable`` if the registry cannot be
   reached in time: the server is stopped again and the error raised);
5. health SERVING.

Graceful stop (``handle.stop()``, or SIGTERM/SIGINT while ``handle.wait()`` runs):

1. deregister (revoke the lease: the key disappears at once, watchers drop the address);
2. health NOT_SERVING for every service; keep serving for ``drain_delay`` (default 1 s, at most ``grace``)
   so that clients see the deregistration before anything is refused -- grpcio answers calls that
   arrive during ``server.stop`` with CANCELLED, which no retry policy retries; then refuse new calls;
3. let in-flight calls finish ...
4. ... and stop;
5. cancel what is still running when ``grace`` seconds have passed (a second signal forces it at once).

``serve`` is for a ``grpc.server`` (threads); ``serve_async`` for a ``grpc.aio.server``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc

from .errors import WaypostError
from .loadreport import mount as mount_load_reports
from .netutil import advertised_address

log = logging.getLogger("waypost.server")

#: how long a stopping server keeps serving after deregistering: a watch event reaches clients in
#: milliseconds on a healthy etcd; one second also covers a loaded client
DEFAULT_DRAIN_DELAY = 1.0

DEFAULT_REGISTRY = "etcd://127.0.0.1:2379"
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class BindError(WaypostError, OSError):
    """The server could not listen on the requested address."""


def _registry_of(registry: Any) -> Any:
    if isinstance(registry, str):
        from .registry import connect

        return connect(registry)
    return registry


def _health_pb2() -> Any:
    from grpc_health.v1 import health_pb2

    return health_pb2


def _bind(server: Any, listen_on: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port = (server.add_secure_port(listen_on, credentials) if credentials is not None
                else server.add_insecure_port(listen_on))
    except RuntimeError as e:  # grpcio raises RuntimeError("Failed to bind to address ...")
        raise BindError(f"cannot listen on {listen_on!r}: {e}") from None
    if not port:
        raise BindError(f"cannot listen on {listen_on!r} (address in use or not local)")
    return int(port)


def _check_args(key: str, grace: float) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"serve: key must be a non-empty string, got {key!r}")
    if grace < 0:
        raise ValueError(f"serve: grace must be >= 0 seconds, got {grace!r}")


class _Base:
    """What the sync and async handles share."""

    def __init__(self, server: Any, key: str, address: str, port: int, registry: Any, publisher: Any,
                 health: Any, grace: float) -> None:
        self.server = server
        self.key = key
        self.address = address
        self.port = port
        self.registry = registry
        self.publisher = publisher
        #: the grpc.health.v1 servicer added by serve (None with health=False); set your own services on it
        self.health = health
        self.grace = grace
        #: seconds between deregistration and refusing calls (clients need it to notice); set by serve()
        self.drain_delay = DEFAULT_DRAIN_DELAY
        self._force = False

    @property
    def registered_key(self) -> str | None:
        """The full registry key of the registration now (None while paused or stopped)."""
        return self.publisher.key  # type: ignore[no-any-return]

    def _health_services(self) -> list[str]:
        return ["", self.key]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r} at {self.address}>"


class ServeHandle(_Base):
    """A running, registered ``grpc.server`` (returned by ``waypost.serve``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False

    # -- traffic control -------------------------------------------------------------------------

    def pause(self) -> None:
        """Drain: revoke the registration and report NOT_SERVING; calls still reaching us are served."""
        self.publisher.pause()
        self._set_health(False)
        log.info("%r: paused (deregistered, NOT_SERVING)", self)

    def resume(self) -> None:
        """Undo pause(): register again (RegistryUnavailable if that fails in time) and report SERVING."""
        self.publisher.resume()
        self._set_health(True)
        log.info("%r: resumed", self)

    def _set_health(self, serving: bool) -> None:
        if self.health is None:
            return
        pb = _health_pb2()
        status = pb.HealthCheckResponse.SERVING if serving else pb.HealthCheckResponse.NOT_SERVING
        for name in self._health_services():
            self.health.set(name, status)

    # -- stopping --------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Block until SIGTERM/SIGINT (handlers installed only on the main thread) or ``stop()``; a signal
        runs the graceful stop here. True when the server has stopped (False: ``timeout`` passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._signal_handlers():
            while not self._requested.is_set() and not self._stopped.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._requested.wait(0.2 if left is None else min(0.2, left))
            if not self._stopped.is_set():
                self.stop()  # requested by a signal: stop here, in the waiting thread
            return True

    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in _SIGNALS}

        def on_signal(signum: int, _frame: Any) -> None:
            if self._requested.is_set():
                log.warning("%r: second %s, stopping now", self, signal.Signals(signum).name)
                self._force = True
            else:
                log.info("%r: %s, stopping gracefully (grace %gs)", self, signal.Signals(signum).name, self.grace)
                self._requested.set()

        for s in _SIGNALS:
            signal.signal(s, on_signal)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def stop(self, grace: float | None = None) -> None:
        """The graceful stop (module docstring). Idempotent; concurrent callers wait for the first."""
        with self._lock:
            first = not self._stopping
            self._stopping = True
        self._requested.set()
        if not first:
            self._stopped.wait()
            return
        grace = self.grace if grace is None else grace
        try:
            try:
                self.publisher.stop()  # (1) the key disappears before we refuse anything
            except Exception as e:  # noqa: BLE001 -- any failure: the lease then expires by its TTL
                log.warning("%r: deregistration failed (%s); the lease will expire by its TTL", self, e)
            if self.health is not None:
                self.health.enter_graceful_shutdown()  # (2) NOT_SERVING
            # (2) keep serving while clients learn of the deregistration (a second signal cuts it short)
            until = time.monotonic() + min(self.drain_delay, grace)
            while not self._force and time.monotonic() < until:
                time.sleep(min(0.05, max(0.0, until - time.monotonic())))
            done = self.server.stop(grace)  # (2) refuse new calls, (3)+(4) drain, (5) cancel after grace
            while not done.wait(0.1):
                if self._force:
                    self.server.stop(0)
                    self._force = False
            log.info("%r: stopped", self)
        finally:
            self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def __enter__(self) -> ServeHandle:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    server: grpc.Server,
    key: str,
    listen_on: str = "0.0.0.0:0",
    registry: Any = DEFAULT_REGISTRY,
    metadata: Mapping[str, Any] | None = None,
    grace: float = 10.0,
    advertise: str | None = None,
    ttl: int = 10,
    id: int | str | None = None,
    format: str = "gozero",
    allow_loopback: bool | None = None,
    health: bool = True,
    credentials: grpc.ServerCredentials | None = None,
    *,
    register_timeout: float = 5.0,
    drain_delay: float = DEFAULT_DRAIN_DELAY,
) -> ServeHandle:
    """Bind, start and register a ``grpc.server`` (not started yet) under ``key``; returns its handle.

    ``registry`` is a registry URL or a Registry (``waypost.connect``). ``advertise`` overrides the
    detected address (see ``waypost.netutil``). Raises ``waypost.RegistryUnavailable`` (server stopped
    again) when the registry cannot be reached within ``register_timeout`` seconds. When stopping, the
    server keeps serving for ``drain_delay`` seconds (at most ``grace``) after deregistering, so that
    clients drop it before it refuses calls.
    """
    _check_args(key, grace)
    reg = _registry_of(registry)
    servicer = _add_health(server, key) if health else None
    mount_load_reports(server)  # waypost.load.v1.LoadReporter + call accounting (waypost.loadreport)
    port = _bind(server, listen_on, credentials)
    try:
        address, publisher = _publisher(reg, key, listen_on, port, advertise, allow_loopback,
                                        ttl=ttl, id=id, metadata=metadata, format=format, timeout=register_timeout)
    except BaseException:
        # grpcio keeps a bound, never-started server's socket listening even after stop(): start it
        # (nobody knows the address yet) so that stop() really closes the port
        server.start()
        server.stop(0).wait(5)
        raise
    server.start()
    try:
        publisher.start()
    except BaseException:
        server.stop(0).wait(5)
        raise
    handle = ServeHandle(server, key, address, port, reg, publisher, servicer, grace)
    handle.drain_delay = max(0.0, float(drain_delay))
    handle._set_health(True)
    log.info("serving %r at %s (registered as %s)", key, address, publisher.key)
    return handle


def _publisher(reg: Any, key: str, listen_on: str, port: int, advertise: str | None, allow_loopback: bool | None,
               **publisher_args: Any) -> tuple[str, Any]:
    """The advertised address and the (not yet started) Publisher that will register it."""
    from .discovery import Publisher

    address = advertised_address(listen_on, port, advertise=advertise, registry=reg, allow_loopback=allow_loopback)
    return address, Publisher(reg, key, address, **publisher_args)


def _add_health(server: Any, key: str) -> Any:
    from grpc_health.v1 import health as health_mod
    from grpc_health.v1 import health_pb2_grpc

    servicer = health_mod.HealthServicer(experimental_non_blocking=True)
    pb = _health_pb2()
    for name in ("", key):
        servicer.set(name, pb.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


# ------------------------------------------------------------------------------------------------ aio


class AsyncServeHandle(_Base):
    """A running, registered ``grpc.aio.server`` (returned by ``await waypost.serve_async(...)``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None

    async def pause(self) -> None:
        """Drain: revoke the registration and report NOT_SERVING."""
        await self.publisher.apause()
        await self._set_health(False)

    async def resume(self) -> None:
        """Undo pause()."""
        await self.publisher.aresume()
        await self._set_health(True)

    async def _set_health(self, serving: bool) -> None:
        if self.health is None:
            return
        pb = _health_pb2()
        status = pb.HealthCheckResponse.SERVING if serving else pb.HealthCheckResponse.NOT_SERVING
        for name in self._health_services():
            await self.health.set(name, status)

    async def wait(self) -> None:
        """Until SIGTERM/SIGINT (handlers installed only when this loop runs on the main thread) or
        ``stop()``; a signal runs the graceful stop. A second signal forces the stop."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                try:
                    loop.add_signal_handler(s, self._on_signal, s)
                    installed.append(s)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        try:
            await self._requested.wait()
            await self.stop()
        finally:
            for s in installed:
                loop.remove_signal_handler(s)

    def _on_signal(self, signum: int) -> None:
        if self._requested.is_set():
            log.warning("%r: second %s, stopping now", self, signal.Signals(signum).name)
            self._force = True
            asyncio.ensure_future(self.server.stop(0))
        else:
            log.info("%r: %s, stopping gracefully (grace %gs)", self, signal.Signals(signum).name, self.grace)
            self._requested.set()

    async def stop(self, grace: float | None = None) -> None:
        """The graceful stop (module docstring). Idempotent."""
        self._requested.set()
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(self.grace if grace is None else grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: float) -> None:
        try:
            try:
                await self.publisher.astop()
            except Exception as e:  # noqa: BLE001 -- any failure: the lease expires by its TTL
                log.warning("%r: deregistration failed (%s); the lease will expire by its TTL", self, e)
            if self.health is not None:
                await self.health.enter_graceful_shutdown()
            # keep serving while clients learn of the deregistration (a second signal cuts it short)
            until = time.monotonic() + min(self.drain_delay, grace)
            while not self._force and time.monotonic() < until:
                await asyncio.sleep(min(0.05, max(0.0, until - time.monotonic())))
            await self.server.stop(grace)
            log.info("%r: stopped", self)
        finally:
            self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def __aenter__(self) -> AsyncServeHandle:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_async(
    server: grpc.aio.Server,
    key: str,
    listen_on: str = "0.0.0.0:0",
    registry: Any = DEFAULT_REGISTRY,
    metadata: Mapping[str, Any] | None = None,
    grace: float = 10.0,
    advertise: str | None = None,
    ttl: int = 10,
    id: int | str | None = None,
    format: str = "gozero",
    allow_loopback: bool | None = None,
    health: bool = True,
    credentials: grpc.ServerCredentials | None = None,
    *,
    register_timeout: float = 5.0,
    drain_delay: float = DEFAULT_DRAIN_DELAY,
) -> AsyncServeHandle:
    """``serve`` for a ``grpc.aio.server`` (not started yet): bind, ``await server.start()``, register."""
    _check_args(key, grace)
    reg = _registry_of(registry)
    servicer = await _add_health_async(server, key) if health else None
    mount_load_reports(server)  # waypost.load.v1.LoadReporter (waypost.loadreport)
    port = _bind(server, listen_on, credentials)
    try:
        address, publisher = _publisher(reg, key, listen_on, port, advertise, allow_loopback,
                                        ttl=ttl, id=id, metadata=metadata, format=format, timeout=register_timeout)
    except BaseException:
        await server.start()  # see serve(): only a started server releases its port on stop()
        await server.stop(0)
        raise
    await server.start()
    try:
        await publisher.astart()
    except BaseException:
        await server.stop(0)
        raise
    handle = AsyncServeHandle(server, key, address, port, reg, publisher, servicer, grace)
    handle.drain_delay = max(0.0, float(drain_delay))
    await handle._set_health(True)
    log.info("serving %r at %s (registered as %s)", key, address, publisher.key)
    return handle


async def _add_health_async(server: Any, key: str) -> Any:
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    servicer = health_aio.HealthServicer()
    pb = _health_pb2()
    for name in ("", key):
        await servicer.set(name, pb.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


__all__ = ["AsyncServeHandle", "BindError", "ServeHandle", "serve", "serve_async"]
