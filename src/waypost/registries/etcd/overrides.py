"""Operator overrides kept in a keyed registry's own keys (etcd, memory): the ``OverrideStore`` a registration in it
follows (``EtcdRegistrar.override_store``).

The record ``_waypost/override/<key>/<address>`` (``waypost drain``, the console) has no lease: it stays until it is
deleted, across restarts of the instance. ``watch`` gives its value now, then each change, kept up across etcd
failures (after one: read again, go on watching from there). A role that may not read it follows no override (said
once); a record that is no valid override counts as none (said once).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from ... import _loop
from ...backoff import cool_down
from ...discovery.override import OVERRIDE_ROOT
from ...discovery.store import Registry
from ...errors import PermissionDenied
from ...kinds import parse_override

log = logging.getLogger("waypost.discovery")
T = TypeVar("T")

#: bounded pause after a failed watch of the record
RETRY_INTERVAL = 1.0


class RegistryOverrides:
    """The override records of ``registry`` (a ``Registry``: shared, so ``close`` leaves it open)."""

    def __init__(self, registry: Registry, rng: random.Random | None = None) -> None:
        self.registry = registry
        self.url = registry.url
        self._rng = rng or random.Random()
        self._bad_logged = False

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> Any:
        return await _on_control_loop(self.registry.put(key, value, prev_kv=prev_kv))

    async def delete(self, key: str, *, prev_kv: bool = False) -> Any:
        return await _on_control_loop(self.registry.delete(key, prev_kv=prev_kv))

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` has a record under ``key`` in any wire format."""
        return await _on_control_loop(self._registered(key, address))

    async def _registered(self, key: str, address: str) -> bool:
        from ...discovery.formats import FORMATS

        for fmt in FORMATS.values():
            prefix = fmt.prefix(key)
            res = await self.registry.get(prefix, prefix=True)
            if any((e := fmt.decode(kv.key, kv.value)) is not None and e.address == address for kv in res.kvs):
                return True
        return False

    async def close(self) -> None:
        """Nothing to free: the registry is shared."""

    async def watch(self, key: str) -> AsyncIterator[bytes | None]:
        """The record's value now (None: no record; a failure of this first read is raised), then at each change."""
        try:
            res = await self.registry.get(key)
        except PermissionDenied as e:
            self._refused(key, e)
            yield None
            await _forever()
            return
        revision, current = res.revision, self._checked(key, res.kvs[0].value if res.kvs else None)
        yield current
        while True:
            watch = self.registry.watch(key, start_revision=revision + 1)
            try:
                async for batch in watch:
                    revision = max(revision, watch.revision)
                    last = batch[-1] if batch else None
                    value = self._checked(key, last.kv.value if last is not None and last.type == "put" else None)
                    if last is not None and value != current:
                        current = value
                        yield value
                raise ConnectionError("the watch ended")
            except asyncio.CancelledError:
                raise
            except PermissionDenied as e:
                self._refused(key, e)
                await _forever()
            except Exception as e:  # noqa: BLE001 (a registration follows its record across etcd failures)
                log.debug("watch of the override record %r failed: %s", key, e)
                await asyncio.sleep(cool_down(self._rng, RETRY_INTERVAL))
                try:  # a change may have been missed: read it again, and watch from there
                    res = await self.registry.get(key)
                except asyncio.CancelledError:
                    raise
                except Exception as e2:  # noqa: BLE001
                    log.debug("reading the override record %r failed: %s", key, e2)
                    continue
                revision = max(revision, res.revision)
                value = self._checked(key, res.kvs[0].value if res.kvs else None)
                if value != current:
                    current = value
                    yield value
            finally:
                watch.cancel()

    def _checked(self, key: str, value: bytes | None) -> bytes | None:
        """``value``, or None (logged once) when it is no valid override record."""
        if value is not None and parse_override(value) is None:
            if not self._bad_logged:
                self._bad_logged = True
                log.warning("ignoring the override record %r: not a JSON object with a whole weight >= 0: %r",
                            key, value[:200])
            return None
        return value

    def _refused(self, key: str, e: PermissionDenied) -> None:
        log.info("cannot read the override record %r, so operator drains do not reach this registration (grant "
                 "read on %r to follow them): %s", key, OVERRIDE_ROOT, e)


async def _on_control_loop(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run where the shared registry lives (the control loop), awaited from any loop."""
    if _loop.in_loop():
        return await coro
    return await asyncio.wrap_future(_loop.submit(coro))


async def _forever() -> None:
    """A role that may not read the record follows none: the follower is held still (it is cancelled with the
    registration) instead of asking again and again."""
    await asyncio.Event().wait()


def from_url(url: str) -> RegistryOverrides:
    """The override records of the keyed registry at ``url`` (the kind's ``override_store``: ``waypost drain``)."""
    from ...discovery.connections import connect

    return RegistryOverrides(connect(url))
