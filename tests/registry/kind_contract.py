"""The contract test suite of a registry kind: what every kind written against ``waypost.kinds`` does, exercised
through public paths only (``waypost.serve(registry=URL)``, ``waypost.dial(TARGET)``, the kind's ``Discovery``,
``waypost drain``'s override store) against a real registry.

A kind's test module subclasses ``KindContract`` (its name starting with ``Test``) and gives the registry's
``kind``, the URLs, and the few things only a test of that registry knows how to do (delete an instance behind the
registration's back, break and heal the registry). A kind that is only read (no registrar: DNS, Kubernetes) sets
``READ_ONLY`` and gives ``instances_up`` (real servers the registry lists some other way: DNS records, a
Service's endpoints); the registration tests are then skipped, the discovery ones run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer
from harness.waiting import wait_until
from waypost.kinds import Backend, Discovery, RegistryKind
from waypost.resolver.target import parse_target

SERVICE = "greeter"


class KindContract:
    """The suite; see the module docstring. Time-outs are generous bounds, never asserted durations."""

    #: the kind under test
    kind: ClassVar[RegistryKind]
    #: no registrar: the registration tests are skipped
    READ_ONLY: ClassVar[bool] = False
    #: the ttl the servers register with (small: an external delete or a kill is seen within it)
    TTL: ClassVar[int] = 3

    # ---- what a kind's test module gives -------------------------------------------------------------

    def registry_url(self) -> str:
        """The URL ``serve(registry=...)`` takes."""
        raise NotImplementedError

    def target(self, service: str) -> str:
        """The dial target of ``service``."""
        raise NotImplementedError

    def unreachable_url(self) -> tuple[str, str]:
        """A registry URL nothing answers at, and a piece of the cause ``RegistryUnavailable`` names."""
        raise NotImplementedError

    def delete_instance(self, service: str, address: str) -> None:
        """Delete the instance of ``address`` behind its registration's back (an operator, an expiry)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        """The registry unreachable for clients while inside (then back)."""
        raise NotImplementedError
        yield

    @contextlib.contextmanager
    def instances_up(self, names: Sequence[str]) -> Iterator[dict[str, str]]:
        """Real Echo servers named ``names``, listed by the registry while inside: name -> address. The default
        serves each with ``serve(registry=registry_url())``; a read-only kind lists them its own way."""
        with contextlib.ExitStack() as stack:
            yield {name: stack.enter_context(self.served(name)).address for name in names}

    def carried(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """What the kind's ``Discovery`` reads back of ``metadata`` written by a registration (default: the same;
        a registry of string values, e.g. Kratos' layout in ZooKeeper: each value as a string)."""
        return metadata

    def dial_options(self) -> list[tuple[str, Any]]:
        """The channel options the contract's dials take (e.g. DNS's faster refresh)."""
        return []

    # ---- helpers -------------------------------------------------------------------------------------

    def listed(self, service: str = SERVICE) -> dict[str, Backend]:
        """What the kind's ``Discovery`` reads now: address -> backend."""
        async def read() -> Sequence[Backend]:
            discovery: Discovery = waypost.kinds.load_part(self.kind, "discovery")(parse_target(self.target(service)))
            try:
                return await discovery.instances(service)
            finally:
                await discovery.close()

        return {b.address: b for b in asyncio.run(read())}

    @contextlib.contextmanager
    def served(self, name: str, **kw: Any) -> Iterator[Any]:
        echo = EchoServer(name)
        handle = waypost.serve(echo.server, SERVICE, listen_on="127.0.0.1:0", registry=self.registry_url(),
                               ttl=self.TTL, grace=0.5, **kw)
        try:
            yield handle
        finally:
            handle.stop(0.5)

    @staticmethod
    def answered(channel: Any, n: int = 10) -> set[str]:
        stub = echo_pb2_grpc.EchoStub(channel)
        return {stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=5).server for _ in range(n)}

    def _needs_registrar(self) -> None:
        if self.READ_ONLY:
            pytest.skip(f"the {self.kind.title} kind is only read")

    # ---- the contract ------------------------------------------------------------------------------------

    def test_dial_reaches_the_instances(self) -> None:
        with self.instances_up(["a", "b"]) as up:
            wait_until(lambda: set(up.values()) <= self.listed().keys(), what="both instances listed")
            with waypost.dial(self.target(SERVICE), balancer="round_robin", options=self.dial_options()) as ch:
                wait_until(lambda: self.answered(ch) == {"a", "b"}, what="both servers answer")

    def test_stop_deregisters(self) -> None:
        self._needs_registrar()
        with self.served("a") as a:
            wait_until(lambda: a.address in self.listed(), what="the instance listed")
        assert a.address not in self.listed()  # removed at stop, not left to expire

    def test_an_external_delete_is_registered_again(self) -> None:
        self._needs_registrar()
        with self.served("a") as a:
            wait_until(lambda: a.address in self.listed(), what="the instance listed")
            self.delete_instance(SERVICE, a.address)
            wait_until(lambda: a.address in self.listed(), timeout=self.TTL * 4, what="registered again")

    def test_an_unreachable_registry_at_start_names_the_cause(self) -> None:
        self._needs_registrar()
        url, cause = self.unreachable_url()
        echo = EchoServer("a")
        with pytest.raises(waypost.RegistryUnavailable, match=cause):
            waypost.serve(echo.server, SERVICE, listen_on="127.0.0.1:0", registry=url, ttl=self.TTL, register_timeout=1.0)
        echo.server.stop(0)

    def test_dial_keeps_the_last_list_through_an_outage(self) -> None:
        with self.instances_up(["a"]) as up:
            with waypost.dial(self.target(SERVICE), options=self.dial_options()) as ch:
                wait_until(lambda: self.answered(ch) == {"a"}, what="the server answers")
                with self.registry_down():
                    with pytest.raises(Exception):  # noqa: B017 -- whatever the kind raises: the registry is down
                        self.listed()
                    assert self.answered(ch, 20) == {"a"}
            wait_until(lambda: up["a"] in self.listed(), what="listed again once the registry is back")

    def test_a_metadata_update_is_seen_by_discovery(self) -> None:
        self._needs_registrar()
        with self.served("a", metadata={"zone": "z1"}) as a:
            wait_until(lambda: dict(self.listed().get(a.address, Backend("")).metadata) == self.carried({"zone": "z1"}),
                       what="the first metadata")
            a.update_metadata({"zone": "z2", "weight": 20})
            wait_until(lambda: dict(self.listed()[a.address].metadata) == self.carried({"zone": "z2", "weight": 20}),
                       what="the new metadata")

    def test_drain_through_the_override_store(self) -> None:
        """``waypost drain``'s record, written through the kind's store: the registration carries weight 0 (or the
        registry stops listing it) until the record is deleted."""
        self._needs_registrar()
        if self.kind.override_store is None:
            pytest.skip(f"the {self.kind.title} kind has no override store")
        from waypost.discovery.override import encode_override, override_key

        def weight(address: str) -> object:
            found = self.listed().get(address)
            return "not listed" if found is None else found.metadata.get("weight", "own")

        async def write(address: str, drain: bool) -> bool:
            store = waypost.kinds.load_part(self.kind, "override_store")(self.registry_url())
            try:
                if drain:
                    await store.put(override_key(SERVICE, address), encode_override(0, "kind-contract", time.time()))
                else:
                    await store.delete(override_key(SERVICE, address))
                return bool(await store.registered(SERVICE, address))
            finally:
                await store.close()

        with self.served("a", metadata={"weight": 20}) as a:
            own, drained = self.carried({"weight": 20})["weight"], self.carried({"weight": 0})["weight"]
            wait_until(lambda: weight(a.address) == own, what="the instance listed with its own weight")
            assert asyncio.run(write(a.address, drain=True))
            wait_until(lambda: weight(a.address) in (drained, "not listed"), what="drained")
            asyncio.run(write(a.address, drain=False))
            wait_until(lambda: weight(a.address) == own, what="its own weight again")
