"""A resolver that works again tells the channel so, even when the list it reads is the one the channel has:
after an outage the channel's error messages stop naming the resolver's failure (real Consul agent, stopped and
started again with its data)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import waypost
from harness import consul_agent
from harness.consul_agent import fixture_consul_bin  # noqa: F401 (fixture)
from harness.waiting import wait_until


@pytest.fixture
def persistent_agent(consul_bin, tmp_path) -> Iterator[consul_agent.ConsulAgent]:
    with consul_agent.ConsulAgent(tmp_path / "consul", binary=consul_bin, persistent=True) as agent:
        yield agent


def test_consul_outage_error_clears_when_the_same_list_is_read_again(persistent_agent):
    agent = persistent_agent
    name = consul_agent.unique_name("recovers")
    agent.register(name, "127.0.0.1", 7001)  # no check: passing while the agent runs
    with waypost.dial(f"consul://{agent.address}/{name}", balancer="round_robin") as ch:

        def listed() -> list[str]:
            return sorted(sc.address for sc in ch.balancer.subconns())

        wait_until(lambda: listed() == ["127.0.0.1:7001"], 20, what="the instance listed")
        agent.stop()
        wait_until(lambda: ch.balancer.resolver_error_message is not None, 30, what="the outage shown")
        assert listed() == ["127.0.0.1:7001"]  # the last list kept
        agent.start()  # same data: the same instance, so the same list
        wait_until(lambda: ch.balancer.resolver_error_message is None, 30, what="the outage no longer shown")
        assert listed() == ["127.0.0.1:7001"]
