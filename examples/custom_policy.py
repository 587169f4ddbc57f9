"""A custom load-balancing policy: smooth weighted round robin with dynamic weights, as user code.

Importing this module registers the policy as ``my_swrr``; any channel can then name it in its service config:

    waypost.dial(target, service_config={"loadBalancingConfig": [{"my_swrr": {}}]})

Each backend's weight is its registration metadata ``weight`` (``waypost.serve(..., metadata={"weight": 20})``;
missing: 100). Each pick adds every backend's effective weight to its current weight, takes the largest and
subtracts the total from it (nginx's smooth weighted round robin: weights 4:2:1 give a b a c a b a). A call that
fails with a code that blames the backend halves its effective weight (at least 1); each success adds 1 back, up
to the registered weight. docs/custom-policies.md explains the contract.

Run it as a client of the Greeter servers of this directory:

    python examples/custom_policy.py [--target etcd:///127.0.0.1:2379?key=greet.rpc] [-n 12]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import waypost
from waypost import Outcome, Picker, PickInfo, PickResult, Policy

log = logging.getLogger("custom_policy")

#: the weight of a backend that registered none
DEFAULT_WEIGHT = 100
#: the codes that say the backend is in trouble (the built-in policies count the same ones); any other code,
#: such as INVALID_ARGUMENT or NOT_FOUND, is the request's fault and a success for the backend's weight
BACKEND_FAILURES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED,
})


def registered_weight(backend: waypost.Backend) -> int:
    """The backend's ``weight`` metadata as a positive int; a bad value is logged and replaced by the default."""
    raw = backend.metadata.get("weight", DEFAULT_WEIGHT)
    try:
        weight = int(str(raw))
    except ValueError:
        weight = 0
    if weight < 1:
        log.warning("backend %s: weight %r is not a positive integer; using %d", backend.address, raw,
                    DEFAULT_WEIGHT)
        return DEFAULT_WEIGHT
    return weight


class _State:
    """What the policy remembers about one address, across pickers."""

    __slots__ = ("current", "effective", "weight")

    def __init__(self, weight: int) -> None:
        self.weight = weight  # as registered
        self.effective = weight  # lowered by failures, restored by successes
        self.current = 0


class SmoothWeightedPicker(Picker):
    """Picks over one immutable list of READY backends; the weights it moves belong to the policy."""

    def __init__(self, policy: SmoothWeightedPolicy, entries: Sequence[tuple[waypost.Backend, _State]]) -> None:
        self._policy = policy
        self._entries = tuple(entries)

    def pick(self, info: PickInfo) -> PickResult:
        if not self._entries:
            raise waypost.NoBackendAvailable("my_swrr: no READY backend")
        with self._policy.lock:
            total = 0
            best = self._entries[0]
            for entry in self._entries:
                state = entry[1]
                state.current += state.effective
                total += state.effective
                if state.current > best[1].current:
                    best = entry
            best[1].current -= total
        backend, state = best
        return PickResult(backend, lambda outcome: self._policy.call_ended(state, outcome))


class SmoothWeightedPolicy(Policy):
    """Smooth weighted round robin over the ``weight`` metadata; failures halve a backend's weight for a while."""

    name = "my_swrr"

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.lock = threading.Lock()
        self._states: dict[str, _State] = {}

    # No parse_config: this policy takes no settings, and the default accepts only ``{}`` (or nothing) and
    # rejects any field, naming it. A policy with settings overrides it (see docs/custom-policies.md).

    def build(self, backends: Sequence[waypost.Backend]) -> Picker:
        """A picker over the READY backends. Addresses that stay keep their state; a new weight starts afresh."""
        with self.lock:
            states: dict[str, _State] = {}
            entries = []
            for b in backends:
                if b.address in states:  # the same address twice: once is enough
                    continue
                weight = registered_weight(b)
                state = self._states.get(b.address)
                if state is None or state.weight != weight:
                    state = _State(weight)
                states[b.address] = state
                entries.append((b, state))
            self._states = states
        return SmoothWeightedPicker(self, entries)

    def call_ended(self, state: _State, outcome: Outcome) -> None:
        """The channel calls this once per call (the ``done`` hook of the pick)."""
        with self.lock:
            if outcome.code in BACKEND_FAILURES:
                state.effective = max(1, state.effective // 2)
                state.current = 0
            elif state.effective < state.weight:
                state.effective += 1

    def effective_weights(self) -> dict[str, int]:
        """address -> effective weight now (to look at the policy at work)."""
        with self.lock:
            return {address: state.effective for address, state in self._states.items()}


waypost.register_policy(SmoothWeightedPolicy)

SERVICE_CONFIG: dict[str, Any] = {"loadBalancingConfig": [{"my_swrr": {}}]}


def wait_for_every_backend(channel: Any, timeout: float = 5.0) -> None:
    """``dial`` returns as soon as one backend is READY, and the policy balances over the READY ones: calls made
    at once would all go to the first server that connected. To show the weights at work, wait (at most
    ``timeout`` seconds) until every backend the registry lists is READY."""
    import time

    deadline = time.monotonic() + timeout
    balancer = channel.balancer
    while time.monotonic() < deadline and len(balancer.ready_addresses()) < len(balancer.subconns()):
        time.sleep(0.05)


def main() -> None:
    import argparse

    from greet_pb2 import HelloRequest
    from greet_pb2_grpc import GreeterStub

    p = argparse.ArgumentParser(description="Greeter calls balanced by the my_swrr policy of this file.")
    p.add_argument("--target", default="etcd:///127.0.0.1:2379?key=greet.rpc")
    p.add_argument("-n", type=int, default=12)
    args = p.parse_args()
    with waypost.dial(args.target, service_config=SERVICE_CONFIG) as channel:
        wait_for_every_backend(channel)
        stub = GreeterStub(channel)
        for i in range(args.n):
            reply = stub.SayHello(HelloRequest(name=f"call {i}"), timeout=5)
            print(reply.message, "from", reply.server, flush=True)


if __name__ == "__main__":
    main()
