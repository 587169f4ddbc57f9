"""Helpers for the etcd, registry and discovery tests: run on the control loop, read watches with a deadline,
private registries, etcd users. (Bounded waits and the cuttable TCP proxy: ``harness.waiting``,
``harness.tcp_proxy``; fixtures: ``tests/conftest.py``.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from harness.waiting import wait_until
from waypost import _loop
from waypost.errors import RegistryUnavailable
from waypost.etcd.config import EtcdConfig
from waypost.registries.etcd.store import EtcdRegistry


def run(coro: Any, timeout: float = 30.0) -> Any:
    """Run a coroutine on the control-plane loop and wait for it."""
    return _loop.run(coro, timeout)


def on_loop(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Call a plain function on the control loop (for APIs that must start there)."""

    async def call() -> Any:
        return fn()

    return run(call(), timeout)


def next_batch(watch: Any, timeout: float = 10.0) -> list[Any]:
    """The next event batch of a watch, failing after ``timeout`` seconds."""
    return run(asyncio.wait_for(watch.__anext__(), timeout), timeout + 5)  # type: ignore[no-any-return]


def next_batches(watch: Any, n: int, timeout: float = 10.0) -> list[list[Any]]:
    """The next ``n`` event batches of a watch, failing after ``timeout`` seconds for any one of them."""

    async def read() -> list[list[Any]]:
        return [await asyncio.wait_for(watch.__anext__(), timeout) for _ in range(n)]

    return run(read(), n * timeout + 5)  # type: ignore[no-any-return]


def collect_events(watch: Any, count: int, timeout: float = 15.0) -> list[Any]:
    """The next ``count`` events of a watch (several batches), within ``timeout`` seconds."""

    async def go() -> list[Any]:
        out: list[Any] = []
        while len(out) < count:
            out.extend(await watch.__anext__())
        return out

    return run(asyncio.wait_for(go(), timeout), timeout + 5)  # type: ignore[no-any-return]


def enable_auth(etcd: Any, root_password: str) -> str:
    """Turn etcd auth on with a root user; returns the etcdctl flag that acts as root."""
    etcd.etcdctl("user", "add", "root", f"--new-user-password={root_password}")
    etcd.etcdctl("auth", "enable")
    return f"--user=root:{root_password}"


def add_user(etcd: Any, as_root: str, user: str, password: str, *grants: tuple[str, str]) -> None:
    """Add ``user`` with a role of its own name holding ``grants``: (permission, key prefix) pairs,
    e.g. ("read", "greet.rpc/"), as ``etcdctl role grant-permission ROLE --prefix=true PERM PREFIX``."""
    etcd.etcdctl(as_root, "user", "add", user, f"--new-user-password={password}")
    etcd.etcdctl(as_root, "role", "add", user)
    for permission, prefix in grants:
        etcd.etcdctl(as_root, "role", "grant-permission", user, "--prefix=true", permission, prefix)
    etcd.etcdctl(as_root, "user", "grant-role", user, user)


def make_registry(endpoints: list[str] | str, **kw: Any) -> EtcdRegistry:
    """A private EtcdRegistry (not from connect's cache), closed by the caller."""
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    return EtcdRegistry(EtcdConfig(endpoints=tuple(endpoints), **kw))


@contextlib.contextmanager
def registry(endpoints: list[str] | str, **kw: Any) -> Iterator[EtcdRegistry]:
    reg = make_registry(endpoints, **kw)
    try:
        yield reg
    finally:
        run(reg.close(), 15)


def put_when_back(reg: Any, key: str, value: str, timeout: float = 20.0, interval: float = 0.2) -> None:
    """Put ``key`` through ``reg`` once etcd answers again (after a restart the client may still be reconnecting)."""
    def attempt() -> bool:
        try:
            reg.sync.put(key, value)
        except RegistryUnavailable:
            return False
        return True

    wait_until(attempt, timeout, interval=interval, what=f"put {key} on the restarted etcd")
