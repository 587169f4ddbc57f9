"""Routing by registration metadata: ``metadata_filter`` and ``prefer``/``min_preferred``, end to end with real
gRPC servers registered (with metadata) in an in-process memory registry, and real sync and aio channels."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter

import grpc
import pytest

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers
from waypost.client.routing import Routing

Req = echo_pb2.EchoRequest
_ids = itertools.count()


def _registry(servers, metas):
    name = f"routing-{next(_ids)}"
    registry = waypost.connect(f"memory://{name}")
    pubs = [waypost.Publisher(registry, "svc.rpc", s.address, metadata=m).start() for s, m in zip(servers, metas)]
    return f"memory://{name}/?key=svc.rpc", pubs


def test_routing_arguments_are_validated():
    assert Routing.make(None, None, None) is None
    with pytest.raises(ValueError, match="min_preferred needs prefer"):
        Routing.make(None, None, 2)
    with pytest.raises(ValueError, match="metadata_filter must be a non-empty mapping"):
        Routing.make({}, None, None)
    with pytest.raises(ValueError, match="min_preferred must be an integer >= 1"):
        Routing.make(None, {"zone": "a"}, 0)
    with pytest.raises(ValueError, match=r"prefer\['zone'\] must be a value"):
        waypost.dial("direct:///127.0.0.1:1", prefer={"zone": None}, block=False)


def test_metadata_filter_keeps_only_matching_backends_and_never_connects_to_the_others():
    with echo_servers("canary", "stable1", "stable2") as servers:
        target, pubs = _registry(servers, [{"group": "canary"}, {"group": "stable"}, {"group": "stable", "w": 1}])
        try:
            with waypost.dial(target, balancer="round_robin", metadata_filter={"group": "canary"}) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert {stub.Unary(Req(), timeout=20).server for _ in range(20)} == {"canary"}
                # the policy saw only the kept backend; the others have no connection at all
                assert [sc.address for sc in ch.balancer.subconns()] == [servers[0].address]
            # a list of values: any of them; numbers match their text
            with waypost.dial(target, balancer="round_robin", metadata_filter={"group": ["canary", "stable"],
                                                                               "w": "1"}) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert {stub.Unary(Req(), timeout=20).server for _ in range(10)} == {"stable2"}
        finally:
            for p in pubs:
                p.stop()


def test_no_backend_matching_the_filter_fails_unavailable_naming_the_filter():
    with echo_servers("a") as servers:
        target, pubs = _registry(servers, [{"group": "stable"}])
        try:
            with waypost.dial(target, metadata_filter={"group": "canary"}) as ch, \
                    pytest.raises(grpc.RpcError) as ei:
                echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "no backends matching metadata_filter={'group': 'canary'}" in ei.value.details()
            # direct targets carry no metadata: the filter keeps nothing, and says how many it dropped
            with waypost.dial(f"direct:///{servers[0].address}", metadata_filter={"group": "canary"}) as ch, \
                    pytest.raises(grpc.RpcError) as ei:
                echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "matching metadata_filter={'group': 'canary'} (1 resolved, none matches)" in ei.value.details()
        finally:
            for p in pubs:
                p.stop()


def test_filter_follows_metadata_updates():
    with echo_servers("x", "y") as servers:
        target, pubs = _registry(servers, [{"group": "canary"}, {"group": "stable"}])
        try:
            with waypost.dial(target, balancer="round_robin", metadata_filter={"group": "canary"}) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                assert {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"x"}
                pubs[1].update_metadata({"group": "canary"})
                wait_until(lambda: {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"x", "y"}, 20,
                           what="y joins the canary group")
                pubs[0].update_metadata({"group": "stable"})
                wait_until(lambda: {stub.Unary(Req(), timeout=20).server for _ in range(6)} == {"y"}, 20,
                           what="x leaves the canary group")
        finally:
            for p in pubs:
                p.stop()


def test_prefer_uses_local_backends_while_enough_are_ready_then_spills_and_recovers(caplog):
    caplog.set_level(logging.INFO, logger="waypost.client")
    with echo_servers("a1", "a2", "b1") as servers:
        target, pubs = _registry(servers, [{"zone": "a"}, {"zone": "a"}, {"zone": "b"}])
        try:
            with waypost.dial(target, balancer="round_robin", prefer={"zone": "a"}, min_preferred=2) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 and all(
                    sc.state == 2 for sc in ch.balancer.subconns()), 30, what="everything connected")
                assert {stub.Unary(Req(), timeout=20).server for _ in range(20)} == {"a1", "a2"}
                caplog.clear()
                servers[1].stop(0)  # a2 dies: one preferred backend READY < 2: spill to all
                wait_until(lambda: "b1" in {stub.Unary(Req(), timeout=20).server for _ in range(6)}, 20,
                           what="spill to zone b")
                got = Counter(stub.Unary(Req(), timeout=20).server for _ in range(20))
                assert set(got) == {"a1", "b1"}, got
                spills = [r for r in caplog.records if "spilling" in r.getMessage()]
                assert len(spills) == 1 and spills[0].levelno == logging.INFO, [r.getMessage() for r in spills]
                assert "fewer than min_preferred=2" in spills[0].getMessage()
                assert "prefer={'zone': 'a'}" in spills[0].getMessage()
                # b1 moves into zone a: two preferred READY again, back to them only
                pubs[2].update_metadata({"zone": "a"})
                wait_until(lambda: any("READY again" in r.getMessage() for r in caplog.records), 20,
                           what="recovery logged")
                assert {stub.Unary(Req(), timeout=20).server for _ in range(10)} == {"a1", "b1"}
                pubs[0].update_metadata({"zone": "a", "rack": 1})  # another rebuild, same decision: no new line
                wait_until(lambda: ch.balancer.subconns()[0].backend.metadata.get("rack") == 1, 20)
                lines = [r.getMessage() for r in caplog.records if "zone" in r.getMessage()]
                assert sum("spilling" in m for m in lines) == 1 and sum("READY again" in m for m in lines) == 1
        finally:
            for p in pubs:
                p.stop()


def test_aio_channel_filters_and_prefers():
    async def main(target: str) -> None:
        async with waypost.aio.dial(target, balancer="round_robin", metadata_filter={"group": "g"},
                                    prefer={"zone": "a"}) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            got = {(await stub.Unary(Req(), timeout=20)).server for _ in range(12)}
            assert got == {"g_a"}
            assert {sc.address for sc in ch.balancer.subconns()} == {servers[0].address, servers[1].address}
        async with waypost.aio.dial(target, metadata_filter={"group": "none"}) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "metadata_filter={'group': 'none'}" in ei.value.details()

    with echo_servers("g_a", "g_b", "other_a") as servers:
        target, pubs = _registry(servers, [{"group": "g", "zone": "a"}, {"group": "g", "zone": "b"},
                                           {"group": "other", "zone": "a"}])
        try:
            asyncio.run(asyncio.wait_for(main(target), 60))
        finally:
            for p in pubs:
                p.stop()
