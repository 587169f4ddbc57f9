"""A user's own policy (examples/custom_policy.py, registered as ``my_swrr``) over real gRPC servers found in etcd."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import echo_servers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WEIGHTS = {"a": 4, "b": 2, "c": 1}


@pytest.fixture
def custom_policy() -> Iterator[Any]:
    """The example module, imported as a user would (registering ``my_swrr``), unregistered afterwards."""
    from waypost.balancer.policies import POLICIES

    sys.path.insert(0, str(EXAMPLES))
    try:
        sys.modules.pop("custom_policy", None)
        yield importlib.import_module("custom_policy")
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("custom_policy", None)
        POLICIES.pop("my_swrr", None)


@pytest.fixture
def weighted_backends(shared_etcd, unique_key) -> Iterator[dict[str, str]]:
    """Echo servers a, b, c registered under a fresh key with weights 4, 2, 1; name -> address."""
    with echo_servers(*WEIGHTS) as servers:
        pubs = [waypost.Publisher(shared_etcd.url(), unique_key, s.address, metadata={"weight": WEIGHTS[s.name]})
                .start() for s in servers]
        try:
            yield {s.name: s.address for s in servers}
        finally:
            for p in pubs:
                p.stop()


def test_custom_policy_by_name_in_a_service_config(custom_policy, weighted_backends, shared_etcd, unique_key):
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
    with waypost.dial(target, service_config={"loadBalancingConfig": [{"my_swrr": {}}]}) as channel:
        policy = channel._config.policy  # the channel's instance of the user's class (to look at its weights)
        assert isinstance(policy, custom_policy.SmoothWeightedPolicy)
        stub = echo_pb2_grpc.EchoStub(channel)

        def call(**fail: Any) -> str:
            return str(stub.Unary(echo_pb2.EchoRequest(message="x", **fail), timeout=5).server)

        seen: set[str] = set()
        wait_until(lambda: seen.add(call()) or seen == set(WEIGHTS), 20, "every backend answered")

        # smooth weighted round robin: 4:2:1 (within one pick: the picker may have been built before all were READY)
        counts = Counter(call() for _ in range(70))
        for name, weight in WEIGHTS.items():
            assert abs(counts[name] - 10 * weight) <= 1, counts
        a = weighted_backends["a"]
        assert policy.effective_weights()[a] == 4

        # a failure that blames the backend halves a's effective weight ...
        failed = []

        def fail_once_on_a() -> bool:
            try:
                call(error_code=grpc.StatusCode.UNAVAILABLE.value[0], fail_on="a")
            except grpc.RpcError as e:
                failed.append(e.code())
            return bool(failed)

        wait_until(fail_once_on_a, 20, "a call that a failed")
        assert failed == [grpc.StatusCode.UNAVAILABLE]
        assert policy.effective_weights()[a] == 2
        # ... and successes restore it, one per success on a
        wait_until(lambda: call() and policy.effective_weights()[a] == 4, 20, "a's weight restored")
        # a failure that is the request's fault leaves the weight alone
        wait_until(lambda: _fails(call, error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0], fail_on="a"), 20,
                   "an INVALID_ARGUMENT from a")
        assert policy.effective_weights()[a] == 4


def _fails(call: Any, **fail: Any) -> bool:
    try:
        call(**fail)
    except grpc.RpcError:
        return True
    return False


def test_custom_policy_config_errors_name_the_field(custom_policy):
    with pytest.raises(waypost.InvalidServiceConfig, match=r"my_swrr\.bogus: unknown field for my_swrr"):
        waypost.dial("direct:///127.0.0.1:1", service_config={"loadBalancingConfig": [{"my_swrr": {"bogus": 1}}]})
    with pytest.raises(waypost.InvalidServiceConfig, match="my_swrr"):
        waypost.dial("direct:///127.0.0.1:1", service_config={"loadBalancingConfig": [{"my_swrr": [1]}]})


def test_custom_policy_without_a_weight_shares_evenly(custom_policy):
    with echo_servers("x", "y") as servers, waypost.dial(
            "direct:///" + ",".join(s.address for s in servers), balancer="my_swrr") as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        seen: set[str] = set()
        wait_until(lambda: seen.add(stub.Unary(echo_pb2.EchoRequest(), timeout=5).server) or len(seen) == 2, 20)
        counts = Counter(stub.Unary(echo_pb2.EchoRequest(), timeout=5).server for _ in range(20))
        assert abs(counts["x"] - counts["y"]) <= 2, counts
