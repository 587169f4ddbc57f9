"""Weight 0 drains a backend, end to end: real gRPC servers registered in a real etcd with metadata weights."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers

Req = echo_pb2.EchoRequest


def test_drained_backend_gets_no_traffic_and_all_drained_fails_naming_the_cause(shared_etcd, unique_key):
    registry = waypost.connect(shared_etcd.url())
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
    with echo_servers("drained", "light", "heavy") as (drained, light, heavy):
        pubs = [waypost.Publisher(registry, unique_key, drained.address, metadata={"weight": 0}),
                waypost.Publisher(registry, unique_key, light.address, metadata={"weight": "10"}),
                waypost.Publisher(registry, unique_key, heavy.address, metadata={"weight": 20})]
        for p in pubs:
            p.start()
        try:
            with waypost.dial(target, balancer="smooth_weighted_round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                # the drained backend is connected like the others: it is the policy that skips it
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 3 or stub.Unary(Req(), timeout=20) and False,
                           30, what="three READY backends")
                got = Counter(stub.Unary(Req(), timeout=20).server for _ in range(60))
                # 1:2 (exact over whole rounds from a fresh state; the picks made while waiting may shift the
                # start of the rotation by a pick or two)
                assert set(got) == {"light", "heavy"} and abs(got["heavy"] - 40) <= 2, got

                for p in pubs[1:]:  # the others leave: only the drained one is registered
                    p.stop()
                wait_until(lambda: ch.balancer.ready_addresses() == [drained.address], 30,
                           what="only the drained backend left")
                with pytest.raises(grpc.RpcError) as ei:
                    stub.Unary(Req(), timeout=20)
                assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "every backend has weight 0" in ei.value.details()
        finally:
            for p in pubs:
                p.stop()
