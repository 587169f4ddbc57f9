"""Driving kazoo from waypost's control loop without blocking it: kazoo's ``*_async`` operations awaited as asyncio
futures (``result``), its threads' state changes and watch events handed over (``on_loop``), a client stopped in a
worker thread, bounded (``Session.close``). kazoo is imported only when a client is made (the ``zk`` extra)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...kinds import RegistryUnavailable
from ...netutil import parse_host_port
from .config import DEFAULT_PORT, ZkConfig

#: the longest a probe of one host (why is there no session?) waits for a TCP connection
PROBE_TIMEOUT = 3.0
#: how long ``Session.close`` waits for kazoo to close the session and join its threads
CLOSE_TIMEOUT = 3.0
#: kazoo's own chatter (a WARNING per failed reconnection): ERROR unless the application set it (waypost says each once)
KAZOO_LOGGER = "waypost.zk.kazoo"


def require_kazoo() -> None:
    """ImportError naming the extra when kazoo is not installed."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        raise ImportError("ZooKeeper (zk://) needs kazoo: pip install 'waypost[zk]'") from None


class SessionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger a kazoo client is given (kazoo's public ``logger=``), which also notes the session timeout the
    server granted: the server bounds the one asked to its ``[minSessionTimeout, maxSessionTimeout]``, and the
    granted one decides when an ephemeral node goes. kazoo says it only in its "Session created" log line; should
    a kazoo version word it otherwise, ``granted`` stays None and callers count the timeout they asked for."""

    #: the granted session timeout, seconds (None: none seen)
    granted: float | None = None

    def __init__(self) -> None:
        super().__init__(logging.getLogger(KAZOO_LOGGER), {})

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith("Session created") and len(args) >= 3:
            with contextlib.suppress(TypeError, ValueError):
                self.granted = float(args[2]) / 1000.0  # (session id, password, negotiated timeout in ms, ...)
        super().log(level, msg, *args, **kwargs)

    warn = logging.LoggerAdapter.warning  # kazoo calls warn(), which newer Pythons dropped from adapters


class Session:
    """The kazoo client of a registrar, a discovery or an override store (kazoo required at once): made and started
    on first use, then reconnecting on its own until ``close``."""

    def __init__(self, config: ZkConfig, on_state: Callable[[str], None] | None = None) -> None:
        require_kazoo()
        self.config, self.on_state = config, on_state
        self.log = SessionLog()
        self.client: Any = None

    async def ready(self, session_timeout: float, wait: float) -> Any:
        """The client once it has a session (``session_timeout`` s asked), or ``session``'s error after ``wait`` s."""
        if self.client is None:
            from kazoo.client import KazooClient
            from kazoo.retry import KazooRetry

            if logging.getLogger(KAZOO_LOGGER).level == logging.NOTSET:
                logging.getLogger(KAZOO_LOGGER).setLevel(logging.ERROR)
            # reconnecting forever (pauses from 0.1 s to max_reconnect_delay s, jittered); no command retries: the
            # callers bound and retry their own operations
            self.client = KazooClient(
                hosts=self.config.connect_string, timeout=float(session_timeout), logger=self.log,
                connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4,
                                            max_delay=self.config.max_reconnect_delay),
                command_retry=KazooRetry(max_tries=0))
            if self.on_state is not None:
                self.client.add_listener(self.on_state)
            self.client.start_async()
        await session(self.client, self.config.hosts, wait)
        return self.client

    async def close(self) -> None:
        """Close the session (the server deletes its ephemeral nodes at once) and free the client's threads, in a
        worker thread (stopping kazoo joins its threads), waiting at most ``CLOSE_TIMEOUT`` s for it."""
        client, self.client = self.client, None
        if client is None:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def work() -> None:
            with contextlib.suppress(Exception):  # a client that cannot stop cleanly is abandoned, not fatal
                client.stop()
                client.close()
            on_loop(loop, done.set_result, None)

        threading.Thread(target=work, name="waypost-zk-close", daemon=True).start()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), CLOSE_TIMEOUT)


async def result(async_result: Any) -> Any:
    """Await a kazoo ``IAsyncResult`` on the running loop: its value, or its exception raised here."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ar: Any) -> None:  # on kazoo's completion thread (or here, when already set)
        on_loop(loop, _copy, fut, ar)

    async_result.rawlink(settle)
    try:
        return await fut
    finally:
        if not fut.done():
            async_result.unlink(settle)


def _copy(fut: asyncio.Future[Any], ar: Any) -> None:
    if fut.done():
        return
    exc = ar.exception
    if exc is None:
        fut.set_result(ar.value)
    else:
        fut.set_exception(exc() if isinstance(exc, type) else exc)


def on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` on ``loop`` from a kazoo thread (a listener or a watch); never blocks, never raises."""
    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
        loop.call_soon_threadsafe(fn, *args)


async def session(client: Any, hosts: Sequence[str], timeout: float) -> None:
    """Wait until the started ``client`` has a session, at most ``timeout`` s; RegistryUnavailable naming why not
    (each host probed meanwhile: refused, not answering, not resolvable, or answering TCP without a session). When
    no host takes a TCP connection it is raised at once: kazoo goes on reconnecting, the caller retries."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    up = asyncio.Event()

    def on_state(state: str) -> None:
        if state == "CONNECTED":
            on_loop(loop, up.set)

    client.add_listener(on_state)
    probing = loop.create_task(probe(hosts, min(timeout, PROBE_TIMEOUT)))
    waiting = loop.create_task(up.wait())
    try:
        if client.connected:
            return  # the common case (the probe, cancelled before it runs, connects nowhere)
        await asyncio.wait({probing, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and probing.done() and not probing.result()[1]:
            raise RegistryUnavailable(f"no ZooKeeper session with {','.join(hosts)} ({probing.result()[0]})")
        await asyncio.wait_for(asyncio.shield(waiting), max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        why = probing.result()[0] if probing.done() else "still connecting"
        raise RegistryUnavailable(f"no ZooKeeper session with {','.join(hosts)} within {timeout:g}s ({why})") from None
    finally:
        client.remove_listener(on_state)
        probing.cancel()
        waiting.cancel()


async def probe(hosts: Sequence[str], timeout: float) -> tuple[str, bool]:
    """What each host does with a TCP connection (probed at once), in words, and whether any took one."""
    probes = await asyncio.gather(*(_probe_one(h, timeout) for h in hosts))
    return "; ".join(f"{host}: {answer}" for host, answer, _ in probes), any(ok for _, _, ok in probes)


async def _probe_one(host: str, timeout: float) -> tuple[str, str, bool]:
    name, port = parse_host_port(host, what="ZooKeeper host", default_port=DEFAULT_PORT)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(name, port), timeout)
    except asyncio.TimeoutError:
        return host, f"no answer to a TCP connection within {timeout:g}s", False
    except ConnectionRefusedError:
        return host, "connection refused", False
    except socket.gaierror as e:
        return host, f"cannot resolve {name!r} ({e.strerror or e})", False
    except OSError as e:
        return host, e.strerror or str(e) or type(e).__name__, False
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    return host, ("accepts TCP connections but gave no session (not ZooKeeper, or a server not serving: starting "
                  "up, out of quorum, or refusing the session)"), True
