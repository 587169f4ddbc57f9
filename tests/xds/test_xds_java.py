"""grpc-java (1.85.1) as the foreign peer: its xDS client dialing xds:///NAME through `waypost xds serve` over real
etcd (interop/xds-java, built once with Maven and javac; tests/xds/java_peers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.xds.java_peers import java_classpath, java_timeout_mark
from tests.xds.peer_procs import fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.xds_scenarios import (
    PROPAGATION_BOUND,
    XdsSetup,
    scenario_balance_and_registrations,
    scenario_graceful_sigterm,
    scenario_name_not_exported,
    scenario_pick_first_and_least_request,
    scenario_registered_weights,
    scenario_ring_hash_header,
    scenario_wrr_from_waypost_orca,
)

pytestmark = [java_timeout_mark(), pytest.mark.usefixtures("xds_procs")]


@pytest.fixture(scope="module", name="setup")
def fixture_setup(shared_etcd) -> Iterator[XdsSetup]:
    java_classpath()  # build (or skip) before starting anything
    s = XdsSetup(shared_etcd)
    try:
        yield s
    finally:
        s.close()


def test_grpc_java_xds_balances_and_follows_registrations(setup: XdsSetup) -> None:
    figures = scenario_balance_and_registrations("java", setup)
    assert all(v < PROPAGATION_BOUND for v in figures.values()), figures


def test_grpc_java_xds_ring_hash_keeps_a_key_on_one_backend(setup: XdsSetup) -> None:
    scenario_ring_hash_header("java", setup)


def test_grpc_java_xds_graceful_sigterm_of_a_backend_loses_no_call(setup: XdsSetup) -> None:
    scenario_graceful_sigterm("java", setup)


def test_grpc_java_xds_weighted_round_robin_follows_waypost_orca_reports(setup: XdsSetup) -> None:
    scenario_wrr_from_waypost_orca("java", setup)


def test_grpc_java_xds_pick_first_and_least_request(setup: XdsSetup) -> None:
    scenario_pick_first_and_least_request("java", setup)


def test_grpc_java_xds_fails_at_once_on_a_name_not_exported(setup: XdsSetup) -> None:
    scenario_name_not_exported("java", setup)


@pytest.mark.parametrize("export", ["wt", "wlr"])  # round_robin, least_request
def test_grpc_java_xds_registered_weights_split_the_calls(setup: XdsSetup, export: str) -> None:
    scenario_registered_weights("java", setup, export)
