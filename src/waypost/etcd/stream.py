"""The supervise/reconnect loop shared by the client's long-lived streams (keepalive, watch).

A ``StreamSupervisor`` opens one bidirectional stream on a healthy endpoint (with the auth token and
``hasleader``), hands it to its owner's session coroutine, and when the session ends opens another:
after a pause that doubles from 0.1 s to 1 s, at once for a ``Restart(immediate=True)``. A refused
token is dropped before the next try; a member that failed is marked so the next stream goes to
another one. ``PermissionDenied`` (credentials refused) is handed to the owner, who fails what it
serves: such an outage does not heal by retrying.

During one outage the first failure logs at INFO/WARNING and the retries at DEBUG; when the stream
is back, one "re-established after N s" line and one reconnect count (``StreamOutage``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from .. import metrics
from ..errors import PermissionDenied, RegistryError, RegistryUnavailable
from . import _errors
from .auth import Auth, Metadata
from .endpoints import Endpoint, EndpointPool

FIRST_BACKOFF = 0.1
MAX_BACKOFF = 1.0

#: the owner's session: (endpoint, open call, metadata sent) -> returns when the owner is done
Session = Callable[[Endpoint, grpc.aio.StreamStreamCall, Metadata], Awaitable[None]]


class Restart(Exception):
    """Raised by a session to end its stream and open another (logged at INFO, not as a failure).

    ``immediate``: reconnect without the backoff pause (the stream itself was fine, e.g. a token to
    renew or a move away from a member another call found broken). ``outage=False``: a planned
    restart, not counted as an outage (no "re-established" line, no reconnect count).
    """

    def __init__(self, message: str, *, immediate: bool = False, outage: bool = True) -> None:
        super().__init__(message)
        self.immediate = immediate
        self.outage = outage


class StreamOutage:
    """Outage bookkeeping of one stream: log levels during an outage, one line and one count at its end."""

    def __init__(self, stream: str, clock: Callable[[], float], log: logging.Logger) -> None:
        self.stream = stream  # "keepalive" / "watch": log text and metric label
        self.clock = clock
        self.log = log
        self.since: float | None = None

    def levels(self) -> tuple[int, int]:
        """(info, warning) levels for a failure now: DEBUG for both while an outage is already known."""
        return (logging.INFO, logging.WARNING) if self.since is None else (logging.DEBUG, logging.DEBUG)

    def broken(self) -> None:
        """The stream just ended; the outage starts now unless one is already running."""
        if self.since is None:
            self.since = self.clock()

    def reestablished(self) -> None:
        """The stream is up again: one log line and one count per outage."""
        if self.since is None:
            return
        self.log.info("etcd %s stream re-established after %.1fs", self.stream, self.clock() - self.since)
        self.since = None
        obs = metrics.current
        if obs is not None:
            obs.registry_reconnect(self.stream)


class StreamOwner:
    """What a manager of one supervised stream (the lease keepalives, the watches) tells its callers about it."""

    stream: StreamSupervisor

    @property
    def connected(self) -> bool:
        """True while the stream is open."""
        return self.stream.connected

    @property
    def connects(self) -> int:
        """Number of (re)connections of the stream, for tests and diagnostics."""
        return self.stream.connects


class StreamSupervisor:
    """Keeps one stream of an owner (keepalive or watch manager) running while the owner has work."""

    def __init__(self, name: str, method: str, request_type: type, response_type: type, *,
                 pool: EndpointPool, auth: Auth, clock: Callable[[], float], log: logging.Logger,
                 session: Session, active: Callable[[], bool],
                 on_denied: Callable[[PermissionDenied], None], on_end: Callable[[], None]) -> None:
        self.name = name  # "keepalive" / "watch"
        self._method = method
        self._types = (request_type, response_type)
        self.pool = pool
        self.auth = auth
        self.log = log
        self._session = session
        self._active = active  # the owner still has something to serve
        self._on_denied = on_denied
        self._on_end = on_end  # the owner's per-stream state is reset here
        self.outage = StreamOutage(name, clock, log)
        self._task: asyncio.Task[None] | None = None
        self._suspending = False  # a stop for a fork of the process (waypost._fork) is not an outage
        self.closed = False
        #: True while a stream is open
        self.connected = False
        #: number of (re)connections of the stream, for tests and diagnostics
        self.connects = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def ensure_running(self) -> None:
        """Start the loop if it is not running (on the control loop)."""
        if not self.closed and not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"waypost-etcd-{self.name}")

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF
        log = self.log
        while not self.closed and self._active():
            info, warn = self.outage.levels()
            planned = False
            try:
                await self._open_and_serve()
                backoff = FIRST_BACKOFF
            except asyncio.CancelledError:
                raise
            except Restart as e:
                log.log(info, "etcd %s stream: %s; reconnecting", self.name, e)
                if e.immediate:
                    backoff = 0.0
                planned = not e.outage
            except RegistryUnavailable as e:
                log.log(info, "etcd %s stream: %s", self.name, e)
            except PermissionDenied as e:
                self._on_denied(e)  # the credentials themselves were refused
            except RegistryError as e:
                log.log(warn, "etcd %s stream: %s; reconnecting", self.name, e)
            except grpc.aio.AioRpcError as e:
                log.log(info, "etcd %s stream ended: %s %s", self.name, e.code().name, _errors.details(e))
            except Exception:
                log.exception("etcd %s stream failed; reconnecting", self.name)
            finally:
                self.connected = False
                if not self.closed and not planned and not self._suspending:
                    self.outage.broken()
                self._on_end()
            if self.closed or not self._active():
                break
            await asyncio.sleep(backoff)
            backoff = min(max(backoff, FIRST_BACKOFF) * 2, MAX_BACKOFF)

    async def _open_and_serve(self) -> None:
        ep = await self.pool.pick(self.name)
        md = await self.auth.metadata(ep, require_leader=True)  # a member without a leader cannot serve
        call: Any = ep.stream(self._method, *self._types)(metadata=md)
        self.connected = True
        self.connects += 1
        self.outage.reestablished()
        try:
            await self._session(ep, call, md)
        except grpc.aio.AioRpcError as e:
            if _errors.is_auth_retryable(e):
                self.auth.invalidate_sent(md)
            elif e.code() in _errors.UNAVAILABLE_CODES:
                self.pool.mark_failed(ep)
            raise
        finally:
            call.cancel()

    async def suspend(self) -> None:
        """Stop the stream for a fork of the process (as after a cut, but not counted as an outage)."""
        t = self._task
        if t is not None and not t.done():
            self._suspending = True
            t.cancel()
            try:
                await reap(t, self.log)
            finally:
                self._suspending = False

    def resume(self) -> None:
        """Start the stream again after a fork, if its owner still has something to serve."""
        if self._active():
            self.ensure_running()

    async def close(self) -> None:
        self.closed = True
        t = self._task
        if t is not None and not t.done():
            t.cancel()
            await reap(t, self.log)


async def reap(task: asyncio.Task[Any], log: logging.Logger) -> None:
    """Wait for a cancelled task to finish; a failure at shutdown is only logged."""
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        log.debug("background task failed while closing", exc_info=True)
