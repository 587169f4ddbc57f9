"""The generic registration over a ``waypost.kinds.Registrar`` (``KindRegistration``), through ``serve``: what a
registrar refuses to carry is refused before anything is written, pause and resume remove and write the instance
again, and the instance a registrar sees is the registration's (id from ``Words.id_format``, ttl, metadata). The
registry is a dictionary of this process (a registry of its own, not a stand-in for another)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import waypost
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from waypost.kinds import Instance, InstanceGone, Registrar, RegistryKind, Target, Words
from waypost.registry import kinds

BOARD: dict[str, Instance] = {}


class BoardRegistrar(Registrar):
    def __init__(self, settings: str, timeout: float) -> None:
        self.settings = settings

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise TypeError(f"board: metadata[{key!r}] must be a string, got {value!r}")

    async def register(self, instance: Instance) -> None:
        BOARD[instance.id] = instance

    async def renew(self, instance: Instance) -> None:
        if instance.id not in BOARD:
            raise InstanceGone(instance.id)

    async def deregister(self, instance: Instance) -> None:
        BOARD.pop(instance.id, None)


def _target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    return Target(scheme=scheme, endpoints=(), key=path.strip("/"), raw=raw)


KIND = RegistryKind("board", None, "board:///greeter", url_example="board://", registrar=BoardRegistrar,
                    parse_target=_target, words=Words(id_format="{service}@{host}:{port}"))


@pytest.fixture(autouse=True)
def _board_kind() -> Iterator[None]:
    kinds.load_plugins()
    saved = dict(kinds.KINDS), dict(kinds.SCHEMES)
    waypost.register_kind(KIND, replace=True)
    BOARD.clear()
    yield
    with kinds._lock:
        kinds.KINDS.clear()
        kinds.KINDS.update(saved[0])
        kinds.SCHEMES.clear()
        kinds.SCHEMES.update(saved[1])


def _serve(**kw: Any) -> Any:
    echo = EchoServer("a")
    return waypost.serve(echo.server, "greeter", listen_on="127.0.0.1:0", registry="board://", ttl=3, grace=0.5, **kw)


def test_what_the_registrar_cannot_carry_is_refused_before_anything_is_written() -> None:
    with pytest.raises(TypeError, match=r"board: metadata\['weight'\] must be a string, got 20"):
        _serve(metadata={"weight": 20})
    assert BOARD == {}
    handle = _serve(metadata={"zone": "a"})
    try:
        with pytest.raises(TypeError, match="must be a string"):
            handle.update_metadata({"zone": 1})
        (instance,) = BOARD.values()
        assert dict(instance.metadata) == {"zone": "a"}  # the refused update wrote nothing
    finally:
        handle.stop(0.5)


def test_the_instance_is_the_registrations_and_pause_resume_remove_and_write_it() -> None:
    handle = _serve(metadata={"zone": "a"})
    try:
        want = f"greeter@{handle.address}"
        assert list(BOARD) == [want]
        assert (BOARD[want].service, BOARD[want].address, BOARD[want].ttl) == ("greeter", handle.address, 3)
        handle.pause()
        assert BOARD == {}
        handle.resume()
        assert list(BOARD) == [want]
        del BOARD[want]  # gone behind its back: the next renewal (ttl/3 s) finds out, and it is written again
        wait_until(lambda: want in BOARD, timeout=10, what="registered again after InstanceGone")
    finally:
        handle.stop(0.5)
    assert BOARD == {}
