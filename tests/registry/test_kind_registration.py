"""The generic registration over a ``waypost.kinds.Registrar`` (``KindRegistration``), through ``serve``, on the
``board://`` kind (``board_kind.py``): what a registrar refuses to carry is refused before anything is written, pause
and resume remove and write the instance again, the instance a registrar sees is the registration's (id from
``Words.id_format``, ttl, metadata), and the contract suite (``kind_contract.py``) with its override store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import waypost
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from waypost import kind_table as kinds

from . import board_kind
from .board_kind import BOARD, BOARD_DOWN, RECORDS, WRITES
from .kind_contract import KindContract


@pytest.fixture(autouse=True)
def _board_kind() -> Iterator[None]:
    kinds.load_plugins()
    saved = dict(kinds.KINDS), dict(kinds.SCHEMES)
    waypost.register_kind(board_kind.KIND, replace=True)
    BOARD.clear()
    RECORDS.clear()
    BOARD_DOWN.clear()
    WRITES.clear()
    yield
    BOARD_DOWN.clear()
    with kinds._lock:
        kinds.KINDS.clear()
        kinds.KINDS.update(saved[0])
        kinds.SCHEMES.clear()
        kinds.SCHEMES.update(saved[1])


def _serve(**kw: Any) -> Any:
    echo = EchoServer("a")
    return waypost.serve(echo.server, "greeter", listen_on="127.0.0.1:0", registry="board://", ttl=3, grace=0.5, **kw)


def test_what_the_registrar_cannot_carry_is_refused_before_anything_is_written() -> None:
    with pytest.raises(TypeError, match=r"board: metadata\['weight'\] must not be a float, got 2.5"):
        _serve(metadata={"weight": 2.5})
    assert BOARD == {}
    handle = _serve(metadata={"zone": "a"})
    try:
        with pytest.raises(TypeError, match="must not be a float"):
            handle.update_metadata({"zone": 1.5})
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


def test_a_server_started_under_a_drain_is_registered_drained() -> None:
    """The override record is read before the instance is first written: never listed with its own weight."""
    from waypost.discovery.override import encode_override, override_key
    from waypost.etcd.local import free_port

    address = f"127.0.0.1:{free_port()}"
    RECORDS[override_key("greeter", address)] = encode_override(0, "test", 0.0)
    echo = EchoServer("a")
    handle = waypost.serve(echo.server, "greeter", listen_on=address, registry="board://", ttl=3, grace=0.5,
                           metadata={"weight": 20})
    try:
        assert [dict(i.metadata) for i in WRITES] == [{"weight": 0}]  # drained from its first write
    finally:
        handle.stop(0.5)


class TestBoardKind(KindContract):
    kind = board_kind.KIND

    def registry_url(self) -> str:
        return "board://"

    def target(self, service: str) -> str:
        return f"board:///{service}"

    def unreachable_url(self) -> tuple[str, str]:
        return "board://down", "connection refused"

    def delete_instance(self, service: str, address: str) -> None:
        del BOARD[f"{service}@{address}"]

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        BOARD_DOWN.append(True)
        try:
            yield
        finally:
            BOARD_DOWN.clear()
