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
3. let in-flight calls finish, meanwhile running the ``on_shutdown`` hooks one by one (an exception is
   logged, the next hook runs) ...
4. ... and stop once both are done;
5. cancel what is still running when ``grace`` seconds have passed (a second signal forces it at once).

``hard_deadline`` (seconds after the stop began): if the stop has not finished by then (a hook or a call
that hangs), an ERROR is logged and the process exits with status 70 (``os._exit``, see ``waypost.server.flavours``).

``on_unregistered="exit"`` (no lease for ``max_unregistered`` s): the graceful stop, then exit status 75 by
``SystemExit`` from ``wait()`` on the main thread or from the aio server's loop, else from the stopping thread.

``registry=None`` registers nothing: inside Kubernetes the Service's EndpointSlices are the registry, and a pod is
in them while its readiness probe passes. Health then carries everything: NOT_SERVING until started, SERVING
after, NOT_SERVING from the first step of the graceful stop (and while paused), so a gRPC readiness probe takes
the pod out of the slices during ``drain_delay``, before the server refuses anything (set ``drain_delay`` to the
probe's ``periodSeconds`` x ``failureThreshold`` plus the time clients take to see the change).

``serve`` is for a ``grpc.server`` (threads); ``serve_async`` for a ``grpc.aio.server``. Both run the same
two sequences (start-up and graceful stop, written once below); only how each step runs differs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import grpc

from ..errors import WaypostError
from ..netutil import advertised_address, bind_problem
from ..orca import mount as mount_load_reports
from ..otel import mount_server as mount_tracing
from ..registration.contract import Registration
from ..registration.factory import connect_registries, make_publisher
from .flavours import Aio, HardDeadline, ShutdownHook, Threads, hook_name
from .options import DEFAULT_DRAIN_DELAY, LISTEN_ANY, RegistrySpec, ServeKeywords, ServeOptions

if TYPE_CHECKING:
    from types import FrameType

    from typing_extensions import Unpack

    from ..orca.recorder import ServerMetricsRecorder

log = logging.getLogger("waypost.server")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class BindError(WaypostError, OSError):
    """The server could not listen on the requested address."""


def _health_pb2() -> Any:
    from grpc_health.v1 import health_pb2

    return health_pb2


def _bind(server: grpc.Server | grpc.aio.Server, listen_on: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port = (server.add_secure_port(listen_on, credentials) if credentials is not None
                else server.add_insecure_port(listen_on))
    except RuntimeError as e:  # grpcio raises RuntimeError("Failed to bind to address ..."), the cause in its log
        why = bind_problem(listen_on)
        raise BindError(f"cannot listen on {listen_on!r}: {why or e}") from None
    if not port:
        raise BindError(f"cannot listen on {listen_on!r}: {bind_problem(listen_on) or 'address in use or not local'}")
    return int(port)


# ------------------------------------------------------------------------------- the shared sequences
#
# The start-up and graceful-stop sequences are written once, as generators of steps: a step is a thunk; the
# sync driver runs it, the aio driver runs it and awaits its result when that is awaitable (grpc.aio's
# server and health servicer, and the Publisher's a* methods, are coroutines). What differs between a
# ``grpc.server`` and a ``grpc.aio.server`` is in the two flavour classes (``flavours.py``, same methods).

_Steps = Generator[Callable[[], Any], Any, Any]


def _drive(steps: _Steps) -> Any:
    """Run a sequence of steps in this thread; a step's exception is raised inside the sequence."""
    run = _drive_async(steps, awaiting=False)  # never suspends: nothing is awaited
    try:
        run.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("a sync sequence of steps suspended")


async def _drive_async(steps: _Steps, awaiting: bool = True) -> Any:
    """Run a sequence of steps on this event loop, awaiting what a step returns when it is awaitable."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = step()
            if awaiting and inspect.isawaitable(value):
                value = await value
        except BaseException as e:  # noqa: BLE001 -- the sequence decides (it re-raises what it does not handle)
            error = e


def _health_steps(servicer: Any, services: Iterable[str], serving: bool) -> _Steps:
    pb = _health_pb2()
    status = pb.HealthCheckResponse.SERVING if serving else pb.HealthCheckResponse.NOT_SERVING
    for name in services:
        yield functools.partial(servicer.set, name, status)


def _serve_steps(handle_cls: type[_Base], server: grpc.Server | grpc.aio.Server, key: str, listen_on: str, options: ServeOptions) -> _Steps:
    """Start-up (module docstring, steps 1-5); returns the handle."""
    fl = handle_cls.flavor
    if not isinstance(key, str) or not key:
        raise ValueError(f"serve: key must be a non-empty string, got {key!r}")
    reg = connect_registries(options.registry)
    servicer = None
    if options.health:  # (1) before start, NOT_SERVING for now
        from grpc_health.v1 import health_pb2_grpc

        servicer = fl.new_health_servicer()
        yield from _health_steps(servicer, ("", key), serving=False)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    recorder = mount_load_reports(server)  # waypost.load.v1 + ORCA + call accounting (waypost.orca), before start
    mount_tracing(server)  # while waypost.otel traces: the server's spans join the clients' (waypost.otel.server)
    port = _bind(server, listen_on, options.credentials)  # (2)
    try:
        address, publisher = _publisher(reg, key, listen_on, port, options)
    except BaseException:
        # grpcio keeps a bound, never-started server's socket listening even after stop(): start it
        # (nobody knows the address yet) so that stop() really closes the port
        yield server.start
        yield functools.partial(fl.stop_server, server, 0, limit=5)
        raise
    yield server.start  # (3)
    try:
        yield functools.partial(fl.start_publisher, publisher)  # (4)
    except BaseException:
        yield functools.partial(fl.stop_server, server, 0, limit=5)
        raise
    handle = handle_cls(server, key, address, port, reg, publisher, servicer, options.grace)
    handle.drain_delay = max(0.0, float(options.drain_delay))
    handle.orca_recorder = recorder
    handle.on_shutdown = tuple(options.on_shutdown or ())
    handle.hard_deadline = options.hard_deadline
    publisher.outage.exit_action = handle._exit_unregistered  # "exit": stop the server gracefully first
    yield from handle._health_steps(True)  # (5)
    log.info("serving %r at %s (%s)", key, address,
             f"registered as {publisher.key}" if reg is not None else "registry=None: not registered, health SERVING")
    return handle


class _Flag(Protocol):
    """threading.Event or asyncio.Event: a stop was requested."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...


class _Base:
    """What the sync and async handles share: the pause, resume and graceful-stop sequences, the signals."""

    #: how this handle's server runs its operations (set by each handle class)
    flavor: ClassVar[Threads | Aio]
    #: the server's ORCA ServerMetricsRecorder (None without xds-protos); see waypost.orca.server_recorder
    orca_recorder: ServerMetricsRecorder | None = None

    #: the server serve() started: a grpc.Server (ServeHandle) or a grpc.aio.Server (AsyncServeHandle)
    server: grpc.Server | grpc.aio.Server

    def __init__(self, server: grpc.Server | grpc.aio.Server, key: str, address: str, port: int, registry: RegistrySpec,
                 publisher: Registration, health: Any, grace: float) -> None:
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
        #: run while in-flight calls drain (module docstring, step 3); set by serve()
        self.on_shutdown: tuple[ShutdownHook, ...] = ()
        #: seconds after the stop began when the process exits with status 70 (None: never); set by serve()
        self.hard_deadline: float | None = None
        self._force = False
        self._requested: _Flag
        #: set when the process is to exit after the stop (the registration stayed lost: on_unregistered="exit")
        self._exit_code: int | None = None
        self._exit_unregistered: Callable[[], None]  # that exit: graceful stop, status 75 (run in its own thread)

    @property
    def registered_key(self) -> str | None:
        """The full registry key of the registration now (None while paused or stopped)."""
        return self.publisher.key

    def _health_services(self) -> list[str]:
        return ["", self.key]

    def _health_steps(self, serving: bool) -> _Steps:
        if self.health is not None:
            yield from _health_steps(self.health, self._health_services(), serving)

    def _update_steps(self, metadata: Mapping[str, object] | None) -> _Steps:
        yield functools.partial(self.flavor.update_metadata, self.publisher, metadata)

    def _pause_steps(self) -> _Steps:
        yield functools.partial(self.flavor.pause_publisher, self.publisher)
        yield from self._health_steps(False)
        log.info("%r: paused (deregistered, NOT_SERVING)", self)

    def _resume_steps(self) -> _Steps:
        yield functools.partial(self.flavor.resume_publisher, self.publisher)
        yield from self._health_steps(True)
        log.info("%r: resumed", self)

    def _stop_steps(self, grace: float) -> _Steps:
        """The graceful stop (module docstring, steps 1-5, and the hard deadline)."""
        timer = None if self.hard_deadline is None else HardDeadline(self, self.hard_deadline)
        try:
            yield from self._graceful_steps(grace)
        finally:
            if timer is not None:
                timer.cancel()

    def _graceful_steps(self, grace: float) -> _Steps:
        fl = self.flavor
        try:
            yield functools.partial(fl.stop_publisher, self.publisher)  # (1) the key disappears before we refuse anything
        except Exception as e:  # noqa: BLE001 -- any failure: the lease then expires by its TTL
            log.warning("%r: deregistration failed (%s); the lease will expire by its TTL", self, e)
        if self.health is not None:
            yield self.health.enter_graceful_shutdown  # (2) NOT_SERVING
        # (2) keep serving while clients learn of the deregistration (a second signal cuts it short)
        until = time.monotonic() + min(self.drain_delay, grace)
        while not self._force and time.monotonic() < until:
            yield functools.partial(fl.sleep, min(0.05, max(0.0, until - time.monotonic())))
        # (2) refuse new calls, (3) drain while the hooks run, (4) stop, (5) cancel after grace
        begun = yield functools.partial(fl.begin_stop, self.server, grace)
        for hook in self.on_shutdown:
            try:
                yield functools.partial(fl.run_hook, hook)
            except Exception:  # logged; the next hook still runs
                log.exception("%r: on_shutdown hook %s failed; running the next one", self, hook_name(hook))
        yield functools.partial(fl.wait_stopped, self.server, begun, self)
        log.info("%r: stopped", self)

    def _on_signal(self, signum: int, _frame: FrameType | None = None) -> None:
        if self._requested.is_set():
            log.warning("%r: second %s, stopping now", self, signal.Signals(signum).name)
            self._force = True
            self._force_now()
        else:
            log.info("%r: %s, stopping gracefully (grace %gs)", self, signal.Signals(signum).name, self.grace)
            self._requested.set()

    def _force_now(self) -> None:
        """A second signal came: what this kind of server does at once (beyond setting ``_force``)."""

    def take_force(self) -> bool:
        """True, once, after a second signal asked the stop to cancel what still runs (the caller does it now)."""
        forced, self._force = self._force, False
        return forced

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r} at {self.address}>"


class ServeHandle(_Base):
    """A running, registered ``grpc.server`` (returned by ``waypost.serve``)."""

    flavor = Threads()
    server: grpc.Server
    _requested: threading.Event

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._main_waiting = False  # wait() runs on the main thread (it raises SystemExit for an exit)

    # -- traffic control -------------------------------------------------------------------------

    def pause(self) -> None:
        """Drain: revoke the registration and report NOT_SERVING; calls still reaching us are served."""
        _drive(self._pause_steps())

    def resume(self) -> None:
        """Undo pause(): register again (RegistryUnavailable if that fails in time) and report SERVING."""
        _drive(self._resume_steps())

    def update_metadata(self, metadata: Mapping[str, object] | None) -> None:
        """Replace the registration's metadata (e.g. ``{"weight": 5}``): same lease and key, subscribers see
        one change (``Publisher.update_metadata``)."""
        _drive(self._update_steps(metadata))

    # -- stopping --------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Block until SIGTERM/SIGINT (handlers installed only on the main thread) or ``stop()``; a signal
        runs the graceful stop here. True when the server has stopped (False: ``timeout`` passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        on_main = threading.current_thread() is threading.main_thread()
        self._main_waiting = self._main_waiting or on_main
        try:
            with self._signal_handlers():
                while not self._requested.is_set() and not self._stopped.is_set():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._requested.wait(0.2 if left is None else min(0.2, left))
                if not self._stopped.is_set():
                    self.stop()  # requested by a signal (or an exit): stop here, in the waiting thread
            if on_main and self._exit_code is not None:
                raise SystemExit(self._exit_code)  # finally blocks and atexit handlers still run
            return True
        finally:
            if on_main:
                self._main_waiting = False

    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in _SIGNALS}
        for s in _SIGNALS:
            signal.signal(s, self._on_signal)
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
        try:
            _drive(self._stop_steps(self.grace if grace is None else grace))
        finally:
            self._stopped.set()

    def _exit_unregistered(self) -> None:
        from ..registration.outage import UNREGISTERED_EXIT_CODE, exit_process

        self._exit_code = UNREGISTERED_EXIT_CODE
        self.stop()
        if not self._main_waiting:  # (otherwise wait() on the main thread raises SystemExit)
            exit_process(UNREGISTERED_EXIT_CODE)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def __enter__(self) -> ServeHandle:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(server: grpc.Server, key: str, listen_on: str = LISTEN_ANY, **options: Unpack[ServeKeywords]) -> ServeHandle:
    """Bind, start and register a ``grpc.server`` (not started yet) under ``key``; returns its handle.

    ``listen_on`` is where to bind (port 0: a free port, the real one registered). The keywords are the fields
    of ``waypost.ServeOptions`` (their defaults and meanings; ``serve_async`` takes the same ones).

    ``registry`` is a registry URL (``etcd://``, ``consul://``, ``zk://``), a Registry (``waypost.connect``), a list
    of them (registered in each; see ``waypost.registration.factory``), or None (nothing registered: inside
    Kubernetes, readiness through the health service). ``advertise`` overrides the
    detected address (see ``waypost.netutil``). Raises ``waypost.RegistryUnavailable`` (server stopped
    again) when the registry cannot be reached within ``register_timeout`` seconds. When stopping, the
    server keeps serving for ``drain_delay`` seconds (at most ``grace``) after deregistering, so that
    clients drop it before it refuses calls. After ``max_unregistered`` seconds with the lease lost, an ERROR
    is logged and ``on_unregistered`` runs: ``f(publisher)``, or ``"exit"``: the graceful stop, then status 75.

    ``on_shutdown``: callables ``f()`` run in order in the stopping thread, after deregistration and the
    ``drain_delay``, once new calls are refused and while in-flight calls drain (the ``grace`` period);
    each one's exception is logged and the next still runs; the stop ends when the hooks and the calls
    are done. ``hard_deadline``: seconds after the stop began when the process is ended with status 70
    (an ERROR, then ``os._exit``) even if hooks or calls still run.
    """
    handle: ServeHandle = _drive(_serve_steps(ServeHandle, server, key, listen_on,
                                              ServeOptions.from_keywords("waypost.serve", options).for_threads()))
    return handle


def _publisher(reg: RegistrySpec, key: str, listen_on: str, port: int, options: ServeOptions) -> tuple[str, Registration]:
    """The advertised address and the (not yet started) publisher that will register it."""

    address = advertised_address(listen_on, port, advertise=options.advertise, registry=reg,
                                 allow_loopback=options.allow_loopback)
    return address, make_publisher(reg, key, address, **options.publisher_args())


# ------------------------------------------------------------------------------------------------ aio


class AsyncServeHandle(_Base):
    """A running, registered ``grpc.aio.server`` (returned by ``await waypost.serve_async(...)``)."""

    flavor = Aio()
    server: grpc.aio.Server
    _requested: asyncio.Event

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()  # the server's loop (the exit path comes from another thread)

    async def pause(self) -> None:
        """Drain: revoke the registration and report NOT_SERVING."""
        await _drive_async(self._pause_steps())

    async def resume(self) -> None:
        """Undo pause()."""
        await _drive_async(self._resume_steps())

    async def update_metadata(self, metadata: Mapping[str, object] | None) -> None:
        """Replace the registration's metadata: same lease and key, subscribers see one change."""
        await _drive_async(self._update_steps(metadata))

    async def wait(self) -> None:
        """Until SIGTERM/SIGINT (handlers installed only when this loop runs on the main thread) or
        ``stop()``; a signal runs the graceful stop. A second signal forces the stop."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                with suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(s, self._on_signal, s)
                    installed.append(s)
        try:
            await self._requested.wait()
            await self.stop()
        finally:
            for s in installed:
                loop.remove_signal_handler(s)

    def _force_now(self) -> None:
        asyncio.ensure_future(self.server.stop(0))

    def _exit_unregistered(self) -> None:
        from ..registration.outage import UNREGISTERED_EXIT_CODE, exit_process

        try:  # the task's SystemExit propagates out of the server's event loop (and asyncio.run)
            asyncio.run_coroutine_threadsafe(self._stop_and_exit(UNREGISTERED_EXIT_CODE), self._loop)
        except RuntimeError:  # the server's loop is closed: nothing left to stop gracefully
            exit_process(UNREGISTERED_EXIT_CODE)

    async def _stop_and_exit(self, status: int) -> None:
        self._exit_code = status
        await self.stop()
        raise SystemExit(status)

    async def stop(self, grace: float | None = None) -> None:
        """The graceful stop (module docstring). Idempotent."""
        self._requested.set()
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(self.grace if grace is None else grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: float) -> None:
        try:
            await _drive_async(self._stop_steps(grace))
        finally:
            self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def __aenter__(self) -> AsyncServeHandle:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_async(server: grpc.aio.Server, key: str, listen_on: str = LISTEN_ANY,
                      **options: Unpack[ServeKeywords]) -> AsyncServeHandle:
    """``serve`` for a ``grpc.aio.server`` (not started yet): bind, ``await server.start()``, register.
    ``on_unregistered="exit"`` ends the event loop with ``SystemExit(75)`` after the graceful stop.
    ``on_shutdown`` hooks may be plain or coroutine functions (awaited on the server's loop, one by one,
    at the same point as with ``serve``); ``hard_deadline`` as with ``serve``."""
    handle: AsyncServeHandle = await _drive_async(_serve_steps(AsyncServeHandle, server, key, listen_on,
                                                               ServeOptions.from_keywords("waypost.serve_async", options)))
    return handle


__all__ = ["AsyncServeHandle", "BindError", "ServeHandle", "ServeKeywords", "ServeOptions", "serve", "serve_async"]
