"""grpc-go as the foreign peer: its xDS client dialing xds:///NAME through `waypost xds serve` over real etcd,
and its ORCA stack (grpc-go's orca package reporting, weighted_round_robin balancing) as a check of the peers
that waypost's own ORCA code is tested against (tests/xds/orca_peers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.xds.go_peers import go_programs, go_timeout_mark
from tests.xds.orca_peers import (
    A58_LOADS,
    check_a58_split,
    run_wrr_client,
    start_orca_server,
    start_wrr_client,
    wrr_config,
)
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
    watch,
)

pytestmark = [go_timeout_mark(), pytest.mark.usefixtures("xds_procs")]


@pytest.mark.parametrize("oob", [False, True], ids=["per-call", "oob"])
def test_orca_peers_grpc_go_wrr_follows_grpc_go_orca_reports(oob: bool) -> None:
    """orca-server x3 (cpu 0.9/0.3/0.1, rps 100) and grpc-go weighted_round_robin: the last 600 calls split
    about 46/138/415. OOB: the per-call reports say the reverse, so the split shows the OOB stream is used."""
    loads = A58_LOADS
    servers = []
    try:
        for name, cpu in loads.items():
            servers.append(start_orca_server(name, cpu=cpu, rps=100, oob=oob,
                                             call_cpu=(1.0 - cpu) if oob else None))
        result = run_wrr_client([s.address for s in servers], wrr_config(oob=oob, blackout="1s"), 1800,
                                batch=600, interval=0.001, timeout=90)
    finally:
        for s in servers:
            s.stop()
    assert result["errors"] == 0, result
    assert result["batches"][0]["counts"].keys() == set(loads), result["batches"]
    check_a58_split(result["batches"][-1]["counts"], f"grpc-go wrr ({'oob' if oob else 'per call'}), last 600")


def test_orca_server_set_changes_per_call_reports() -> None:
    """`set` on a running orca-server moves grpc-go's weights (per-call reports follow at once)."""
    a = start_orca_server("a", cpu=0.5, rps=100)
    b = start_orca_server("b", cpu=0.5, rps=100)
    try:
        assert a.set(cpu=0.1)["cpu"] == pytest.approx(0.1)
        assert b.set(cpu=0.9, named={"q": 2})["named"] == {"q": 2.0}
        result = run_wrr_client([a.address, b.address], wrr_config(), 1200, batch=400, interval=0.001,
                                timeout=60)
        served = a.served() + b.served()
    finally:
        a.stop()
        b.stop()
    last = result["batches"][-1]["counts"]
    print(f"cpu 0.1 vs 0.9: last 400 calls {last}")
    assert result["errors"] == 0 and served == 1200, result
    assert last.get("a", 0) > 3 * last.get("b", 0), last  # 9:1 expected


def test_orca_server_oob_floor_lets_grpc_go_follow_a_change_out_of_band() -> None:
    """OOB through orca-server's own OpenRcaService (-oob-floor 0.1 s): a `set` during the run moves grpc-go's
    weights within seconds (grpc-go's orca.Register would hold the old values for 30 s)."""
    a = start_orca_server("a", cpu=0.5, rps=100, oob=True, oob_floor=0.1, percall=False)
    b = start_orca_server("b", cpu=0.5, rps=100, oob=True, oob_floor=0.1, percall=False)
    run = start_wrr_client([a.address, b.address], wrr_config(oob=True, oob_period="0.2s"), 100_000, batch=200,
                           interval=0.001)
    try:
        watch(run, lambda c: len(c) == 2 and min(c.values()) >= 60, 30.0, "an even split")
        a.set(cpu=0.1)
        b.set(cpu=0.9)
        line = watch(run, lambda c: c.get("a", 0) >= 5 * c.get("b", 0), 20.0, "a weighted 9:1 over b")
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        a.stop()
        b.stop()
    print(f"\nOOB change followed: batch {line['counts']} (9:1 expected)")
    assert final["errors"] == 0, final


# -- grpc-go's xDS client through `waypost xds serve` over real etcd -----------------------------------------


@pytest.fixture(scope="module", name="setup")
def fixture_setup(shared_etcd) -> Iterator[XdsSetup]:
    go_programs()  # build (or skip) before starting anything
    s = XdsSetup(shared_etcd)
    try:
        yield s
    finally:
        s.close()


def test_grpc_go_xds_balances_and_follows_registrations(setup: XdsSetup) -> None:
    figures = scenario_balance_and_registrations("go", setup)
    assert all(v < PROPAGATION_BOUND for v in figures.values()), figures


def test_grpc_go_xds_ring_hash_keeps_a_key_on_one_backend(setup: XdsSetup) -> None:
    scenario_ring_hash_header("go", setup)


def test_grpc_go_xds_graceful_sigterm_of_a_backend_loses_no_call(setup: XdsSetup) -> None:
    scenario_graceful_sigterm("go", setup)


def test_grpc_go_xds_weighted_round_robin_follows_waypost_orca_reports(setup: XdsSetup) -> None:
    scenario_wrr_from_waypost_orca("go", setup)


def test_grpc_go_xds_pick_first_and_least_request(setup: XdsSetup) -> None:
    scenario_pick_first_and_least_request("go", setup)


def test_grpc_go_xds_fails_at_once_on_a_name_not_exported(setup: XdsSetup) -> None:
    scenario_name_not_exported("go", setup)


@pytest.mark.parametrize("export", ["wt", "wlr"])  # round_robin, least_request
def test_grpc_go_xds_registered_weights_split_the_calls(setup: XdsSetup, export: str) -> None:
    scenario_registered_weights("go", setup, export)
