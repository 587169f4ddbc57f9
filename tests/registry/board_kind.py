"""``board://``: a registry kind whose registry is a dictionary of this process, with an override store that can be
watched: a registry of its own (not a stand-in for another), small enough that a test sees every instance and
record, for the tests of the generic registration and resolver (``waypost.kinds``) and the contract suite.

``BOARD_DOWN`` makes every call fail with ``OSError`` (the registry unreachable); ``board://down`` is a registry
URL whose registrar can never reach it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from waypost.kinds import (
    Backend,
    Instance,
    InstanceGone,
    PollingDiscovery,
    Registrar,
    RegistryKind,
    Target,
    Words,
)

#: the registry: instance id -> instance
BOARD: dict[str, Instance] = {}
#: the override records: key -> value
RECORDS: dict[str, bytes] = {}
#: set: the registry does not answer
BOARD_DOWN: list[bool] = []
#: every instance registered, in order (what was ever written, not only what is there now)
WRITES: list[Instance] = []


def _reachable(settings: str = "board://") -> None:
    if BOARD_DOWN or settings == "board://down":
        raise OSError("board: connection refused")


class BoardRegistrar(Registrar):
    def __init__(self, settings: str, timeout: float) -> None:
        self.settings = settings

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        for key, value in metadata.items():
            if isinstance(value, float):
                raise TypeError(f"board: metadata[{key!r}] must not be a float, got {value!r}")

    async def register(self, instance: Instance) -> None:
        _reachable(self.settings)
        BOARD[instance.id] = instance
        WRITES.append(instance)

    async def renew(self, instance: Instance) -> None:
        _reachable(self.settings)
        if instance.id not in BOARD:
            raise InstanceGone(instance.id)

    async def deregister(self, instance: Instance) -> None:
        _reachable(self.settings)
        BOARD.pop(instance.id, None)


class BoardDiscovery(PollingDiscovery):
    interval = 0.05

    def __init__(self, target: Target) -> None:
        self.target = target

    async def instances(self, service: str) -> Sequence[Backend]:
        _reachable()
        return [Backend(i.address, i.metadata) for i in BOARD.values() if i.service == service]


class BoardOverrides:
    """The override store: records in ``RECORDS``; ``watch`` looks every 0.05 s."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> None:
        _reachable()
        RECORDS[key] = value

    async def delete(self, key: str, *, prev_kv: bool = False) -> None:
        _reachable()
        RECORDS.pop(key, None)

    async def registered(self, key: str, address: str) -> bool:
        return any(i.service == key and i.address == address for i in BOARD.values())

    async def close(self) -> None:
        pass

    async def watch(self, key: str) -> AsyncIterator[bytes | None]:
        last: Any = object()
        while True:
            _reachable()
            now = RECORDS.get(key)
            if now != last:
                last = now
                yield now
            await asyncio.sleep(0.05)


def parse_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    return Target(scheme=scheme, endpoints=(), key=path.strip("/"), raw=raw)


KIND = RegistryKind("board", None, "board:///greeter", url_example="board://", registrar=BoardRegistrar,
                    discovery=BoardDiscovery, override_store=BoardOverrides, parse_target=parse_target,
                    words=Words(id_format="{service}@{host}:{port}"))
