"""ZooKeeper support: settings (``config``), Kratos' node layout (``layout``), and the few helpers that the
publisher (``waypost.registries.zookeeper.publisher``) and the resolver (``waypost.registries.zookeeper.resolver``) share to drive a kazoo
client from the control loop.

kazoo runs threads of its own (per client: a connection thread and two callback workers). Nothing here blocks the
loop: operations are kazoo's ``*_async`` ones, awaited as asyncio futures (``result``); connection state changes and
watch events are handed to the loop with ``call_soon_threadsafe``; stopping a client (which joins its threads) runs
in a worker thread, bounded (``close_client``). kazoo itself is imported only when a client is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any

from ...errors import RegistryUnavailable
from ...netutil import parse_host_port
from .config import (
    DEFAULT_PORT,
    DEFAULT_SESSION_TIMEOUT,
    ZkConfig,
    from_target,
    parse_registry_url,
    require_kazoo,
    resolve_config,
)
from .layout import DEFAULT_NAMESPACE, LayoutError, check_node_name, instance_path, service_path

log = logging.getLogger("waypost.zk")

#: the longest a probe of one host (why is there no session?) waits for a TCP connection
PROBE_TIMEOUT = 3.0
#: how long ``close_client`` waits for kazoo to close the session and join its threads
CLOSE_TIMEOUT = 3.0


async def result(async_result: Any) -> Any:
    """Await a kazoo ``IAsyncResult`` on the running loop: its value, or its exception raised here."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ar: Any) -> None:  # on kazoo's completion thread (or here, when already set)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(_copy, fut, ar)

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
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


async def connect(client: Any, hosts: Sequence[str], timeout: float) -> None:
    """Start ``client`` and wait until it has a session, at most ``timeout`` s; RegistryUnavailable naming why not
    (each host probed meanwhile: refused, not answering, not resolvable, or answering TCP without a session)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()

    def on_state(state: str) -> None:
        if state == "CONNECTED":
            on_loop(loop, ready.set)

    client.add_listener(on_state)
    probing = loop.create_task(probe(hosts, min(timeout, PROBE_TIMEOUT)))
    try:
        client.start_async()
        if not client.connected:
            await asyncio.wait_for(ready.wait(), timeout)
    except asyncio.TimeoutError:
        why = probing.result() if probing.done() else "still connecting"
        raise RegistryUnavailable(
            f"no ZooKeeper session with {','.join(hosts)} within {timeout:g}s ({why})") from None
    finally:
        client.remove_listener(on_state)
        probing.cancel()


async def probe(hosts: Sequence[str], timeout: float = PROBE_TIMEOUT) -> str:
    """What each host does with a TCP connection, as a short text for an error message."""
    return describe_probes(await probe_hosts(hosts, timeout))


async def probe_hosts(hosts: Sequence[str], timeout: float = PROBE_TIMEOUT) -> list[tuple[str, str, bool]]:
    """``(host, what it did, whether it accepted a TCP connection)`` for each host, probed at once."""
    return list(await asyncio.gather(*(_probe_one(h, timeout) for h in hosts)))


def describe_probes(probes: Sequence[tuple[str, str, bool]]) -> str:
    return "; ".join(f"{host}: {answer}" for host, answer, _ in probes)


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


async def close_client(client: Any, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close the session (the server then deletes its ephemeral nodes at once) and free the client's threads and
    sockets, in a worker thread, waiting at most ``timeout`` s (the rest goes on in the background)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def work() -> None:
        try:
            stop_client(client)
        finally:
            on_loop(loop, finished)

    threading.Thread(target=work, name="waypost-zk-close", daemon=True).start()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(done), timeout)


_closing: set[asyncio.Task[None]] = set()


def close_later(client: Any) -> None:
    """``close_client`` in the background, from the loop (the task is kept until it is done)."""
    task = asyncio.get_running_loop().create_task(close_client(client))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def stop_client(client: Any) -> None:
    """``client.stop()`` then ``client.close()``, in the calling thread (it blocks; never on the loop)."""
    try:
        client.stop()
        client.close()
    except Exception as e:  # noqa: BLE001 -- a client that cannot stop cleanly is abandoned, not fatal
        log.debug("waypost: closing a ZooKeeper client: %s", e)


__all__ = [
    "CLOSE_TIMEOUT",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "DEFAULT_SESSION_TIMEOUT",
    "LayoutError",
    "ZkConfig",
    "check_node_name",
    "close_client",
    "close_later",
    "connect",
    "describe_probes",
    "from_target",
    "instance_path",
    "on_loop",
    "parse_registry_url",
    "probe",
    "probe_hosts",
    "require_kazoo",
    "resolve_config",
    "result",
    "service_path",
]
