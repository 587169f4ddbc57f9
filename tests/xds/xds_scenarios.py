"""The cross-language xDS tests, run by ``tests/xds/test_xds_go.py`` and ``tests/xds/test_xds_java.py``
alike with their client: ``XdsSetup`` (one ``waypost xds serve`` over a real etcd) and the ``scenario_*``
functions.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from harness.waiting import wait_until
from tests.xds.orca_peers import A58_LOADS, ClientRun, check_a58_split
from tests.xds.xds_peers import (
    run_xds_client,
    serve_echo,
    start_echo_process,
    start_xds_client,
    xds_control_plane,
)

# -- xDS scenarios, run by tests/xds/test_xds_go.py and tests/xds/test_xds_java.py with their client --------------------

#: exports of the shared control plane: name -> export options after the target
SCENARIO_EXPORTS = {"bal": "", "hash": " policy=ring_hash hash_header=x-key", "term": "",
                    "wrr": " policy=client_side_weighted_round_robin", "pf": " policy=pick_first",
                    "lr": " policy=least_request", "wt": "", "wlr": " policy=least_request"}
#: "eventually" bound for a registry change to reach a client's picks (measured: well under 1 s)
PROPAGATION_BOUND = 15.0


class XdsSetup:
    """One `waypost xds serve` over a real etcd, exporting SCENARIO_EXPORTS under keys of a unique prefix."""

    def __init__(self, etcd: Any) -> None:
        self.registry = etcd.url()
        prefix = f"xdsi{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.keys = {n: f"{prefix}-{n}.rpc" for n in SCENARIO_EXPORTS}
        exports = {n: f"etcd:///{etcd.endpoint}?key={self.keys[n]}{opt}" for n, opt in SCENARIO_EXPORTS.items()}
        self.addr, self.bootstrap, self.proc = xds_control_plane(exports)

    def close(self) -> None:
        self.proc.stop()


def watch(run: ClientRun, pred: Any, timeout: float, what: str) -> dict[str, Any]:
    """The first progress line whose counts satisfy ``pred`` (within ``timeout`` s); lines are kept in run.batches."""
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{run.name}: no batch with {what} within {timeout} s; last {seen[-5:]}; "
                                 f"stderr: {run.stderr_tail()}")
        line = run.progress(left)
        seen.append(line["counts"])
        if pred(line["counts"]):
            return line


def scenario_balance_and_registrations(lang: str, setup: XdsSetup) -> dict[str, float]:
    """Balance over every registered server (a weight 0 one gets nothing); an added registration, a removed one
    and a weight set to 0 reach the client's picks within PROPAGATION_BOUND; no call fails. Returns the
    measured delays (seconds from the registry change to the first batch showing it)."""
    key = setup.keys["bal"]
    handles = {n: serve_echo(n, key, setup.registry) for n in ("a", "b", "c")}
    handles["z"] = serve_echo("z", key, setup.registry, metadata={"weight": 0})
    figures: dict[str, float] = {}
    run = start_xds_client(lang, "xds:///bal", setup.bootstrap, 100_000, interval=0.004, batch=6, deadline=10.0)
    stoppers: list[threading.Thread] = []
    try:
        watch(run, lambda c: {"a", "b", "c"} <= set(c), 60.0, "a, b and c")
        # round robin over all three, none to the weight-0 one
        counts: dict[str, int] = {}
        for _ in range(5):
            for k, v in run.progress(30.0)["counts"].items():
                counts[k] = counts.get(k, 0) + v
        assert set(counts) == {"a", "b", "c"} and min(counts.values()) >= 6, counts

        handles["d"] = serve_echo("d", key, setup.registry)
        t0 = time.monotonic()
        line = watch(run, lambda c: "d" in c, PROPAGATION_BOUND, "the added server d")
        figures["added"] = line["_at"] - t0

        stopper = threading.Thread(target=handles.pop("a").stop, args=(3.0,), daemon=True)
        t0 = time.monotonic()
        stopper.start()  # deregisters at once, serves during the drain delay, then stops
        stoppers.append(stopper)
        line = watch(run, lambda c: "a" not in c and len(c) == 3, PROPAGATION_BOUND, "a gone")
        figures["removed"] = line["_at"] - t0

        t0 = time.monotonic()
        handles["b"].update_metadata({"weight": 0})
        line = watch(run, lambda c: "b" not in c and {"c", "d"} == set(c), PROPAGATION_BOUND, "b drained (weight 0)")
        figures["weight0"] = line["_at"] - t0
        for _ in range(3):
            assert set(run.progress(30.0)["counts"]) == {"c", "d"}
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        for t in stoppers:
            t.join(15)
        for h in handles.values():
            h.stop(0)
    assert final["errors"] == 0, final
    assert "z" not in final["counts"], final["counts"]
    print(f"\n{lang} xDS client over etcd: {final['calls']} calls, 0 failed, {final['counts']}; registry change -> "
          f"picks (first batch showing it, batches of 6 calls at ~4 ms): "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in figures.items()))
    return figures


def scenario_ring_hash_header(lang: str, setup: XdsSetup) -> dict[str, dict[str, int]]:
    """ring_hash on the x-key header: every key stays on one backend, and the keys spread over several."""
    key = setup.keys["hash"]
    handles = {n: serve_echo(n, key, setup.registry) for n in ("h1", "h2", "h3")}
    try:
        # serve() registers in the background: a backend joining after the first calls would move keys (the ring
        # changes), so the client starts once all three are registered and the control plane had time to see them
        wait_until(lambda: all(h.publisher.registered for h in handles.values()), 30.0)
        time.sleep(0.5)
        # ring_hash queues a pick whose backend is still connecting (gRFC A42): even the first calls keep to it.
        # The first call's deadline also covers the JVM's xDS resolution on loaded cores: a long one
        result = run_xds_client(lang, "xds:///hash", setup.bootstrap, 160, headers={"x-key": "user-{i}"},
                                keys=16, wait_for_ready=True, deadline=30.0, timeout=90)
    finally:
        for h in handles.values():
            h.stop(0)
    by_key: dict[str, dict[str, int]] = result["by_key"]
    assert result["errors"] == 0, result
    assert len(by_key) == 16 and all(sum(v.values()) == 10 for v in by_key.values()), by_key
    split = {k: v for k, v in by_key.items() if len(v) != 1}
    assert not split, f"keys reached more than one backend: {split}"
    owners = {next(iter(v)) for v in by_key.values()}
    print(f"\n{lang} ring_hash on x-key: 16 keys x 10 calls, each key on one backend; keys per backend: "
          f"{ {o: sum(1 for v in by_key.values() if o in v) for o in sorted(owners)} }")
    assert len(owners) >= 2, by_key
    return by_key


def scenario_graceful_sigterm(lang: str, setup: XdsSetup) -> None:
    """SIGTERM to a waypost.serve backend process under the client's load: it deregisters, the push reaches the
    client within serve()'s drain delay, then it stops: no call fails, and after its exit only the other is used."""
    key = setup.keys["term"]
    procs = [start_echo_process(n, key, setup.registry) for n in ("t1", "t2")]
    run = start_xds_client(lang, "xds:///term", setup.bootstrap, 100_000, interval=0.002, batch=10, deadline=10.0)
    try:
        watch(run, lambda c: {"t1", "t2"} <= set(c), 60.0, "t1 and t2")
        t_term = time.monotonic()
        procs[0].terminate()
        assert procs[0].proc.wait(20) == 0
        t_exit = time.monotonic()
        after: list[dict[str, Any]] = []  # batches wholly after its exit (earlier ones may still be queued)
        deadline = time.monotonic() + 30.0
        while len(after) < 5:
            line = run.progress(max(deadline - time.monotonic(), 0.1))
            if line["_at"] > t_exit + 0.2:
                after.append(line)
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        for p in procs:
            p.stop()
    assert final["errors"] == 0, final
    assert all(set(b["counts"]) == {"t2"} for b in after), after
    last_t1 = max((b["_at"] for b in final["batches"] if "t1" in b["counts"]), default=t_term)
    print(f"\n{lang} graceful SIGTERM of a backend: {final['calls']} calls, 0 failed; t1 last seen in a batch "
          f"{max(last_t1 - t_term, 0) * 1000:.0f} ms after SIGTERM, it exited after {(t_exit - t_term) * 1000:.0f} ms")


def scenario_wrr_from_waypost_orca(lang: str, setup: XdsSetup) -> dict[str, Any]:
    """client_side_weighted_round_robin over xDS, weights from waypost servers' own ORCA reports (per-call
    trailer; waypost.serve mounts the reporter): cpu 0.9/0.3/0.1 and 100 rps set on their recorders -> the
    client splits 600 calls about 46/138/415 once its weights are in (blackout 1 s, weight update 1 s)."""
    import waypost.orca

    if not waypost.orca.available():
        pytest.skip("waypost servers report no ORCA without xds-protos (pip install waypost[xds])")
    key = setup.keys["wrr"]
    handles = {}
    try:
        for name, cpu in A58_LOADS.items():
            h = handles[name] = serve_echo(f"w-{name}", key, setup.registry)
            rec = waypost.orca.server_recorder(h)
            rec.set_cpu_utilization(cpu)
            rec.set_qps(100.0)
        # waypost.serve registers in the background: until the control plane has seen the registrations the
        # export's assignment is empty and a call fails at once; wait_for_ready makes the first calls wait instead
        result = run_xds_client(lang, "xds:///wrr", setup.bootstrap, 2400, batch=600, interval=0.0015,
                                deadline=30.0, wait_for_ready=True, timeout=120)
    finally:
        for h in handles.values():
            h.stop(0)
    assert result["errors"] == 0, result
    check_a58_split(result["batches"][-1]["counts"], f"{lang} xDS client_side_weighted_round_robin over waypost "
                    "ORCA, last 600 calls", prefix="w-")
    return result


def scenario_pick_first_and_least_request(lang: str, setup: XdsSetup) -> dict[str, dict[str, int]]:
    """The exported policies pick_first and least_request (docs/xds.md's table) are accepted: pick_first sends
    every call to one backend, least_request spreads them; no call fails."""
    handles = [serve_echo(f"{export}{i}", setup.keys[export], setup.registry) for export in ("pf", "lr")
               for i in (1, 2, 3)]
    try:
        runs = {export: start_xds_client(lang, f"xds:///{export}", setup.bootstrap, 60, wait_for_ready=True,
                                         deadline=30.0, max_time=90.0) for export in ("pf", "lr")}
        results = {export: run.finish(120.0) for export, run in runs.items()}
    finally:
        for h in handles:
            h.stop(0)
    print(f"\n{lang} pick_first: {results['pf']['counts']}; least_request: {results['lr']['counts']}")
    for export, result in results.items():
        assert result["errors"] == 0 and result["calls"] == 60, (export, result)
    assert len(results["pf"]["counts"]) == 1, results["pf"]
    assert len(results["lr"]["counts"]) >= 2, results["lr"]
    return {export: r["counts"] for export, r in results.items()}


def scenario_name_not_exported(lang: str, setup: XdsSetup) -> dict[str, Any]:
    """A typo'd ``xds:///NAME`` (not exported) fails with UNAVAILABLE naming it within a 10 s deadline (a JVM's first xDS resolution takes seconds on loaded cores), shorter
    than the client's 15 s does-not-exist timer (unanswered, the call ended DEADLINE_EXCEEDED)."""
    result = run_xds_client(lang, "xds:///greter", setup.bootstrap, 1, deadline=10.0, timeout=60)
    print(f"\n{lang} xDS client, a name not exported: {result.get('codes')} after {result['seconds'] * 1000:.0f} ms "
          f"(process start to end): {result.get('first_error', '')[:200]}")
    codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}  # grpc-go: Unavailable
    assert result["errors"] == 1 and codes == {"UNAVAILABLE": 1}, result
    assert "greter" in result.get("first_error", ""), result
    return result


#: registered weights a weighted run checks, and how far (percentage points) a share may be from its weight
WEIGHT_TOLERANCE = 5.0


def _shares(run: ClientRun, calls: int) -> tuple[dict[str, float], int]:
    """Percent of the next ``calls`` calls (whole batches) each server took; none of them may fail."""
    counts: dict[str, int] = {}
    while sum(counts.values()) < calls:
        line = run.progress(30.0)
        assert not line.get("errors"), line
        for k, v in line["counts"].items():
            counts[k] = counts.get(k, 0) + v
    total = sum(counts.values())
    return {k: round(100.0 * v / total, 1) for k, v in sorted(counts.items())}, total


def _check_shares(shares: dict[str, float], want: dict[str, float], label: str) -> None:
    assert set(shares) == set(want), (label, shares, want)
    for k, w in want.items():
        assert abs(shares[k] - w) <= WEIGHT_TOLERANCE, (label, shares, want)


def scenario_registered_weights(lang: str, setup: XdsSetup, export: str = "wt") -> dict[str, dict[str, float]]:
    """Three servers in one zone registered with weights 10/30/60 split the calls 10/30/60 % (round_robin spreads
    evenly inside a locality: the control plane gives each weight a sub-zone), and re-registered as 80/20/0 they
    split 80/20 with nothing to the drained one, with no failed call. Returns the measured shares."""
    key = setup.keys[export]
    weights = {"a": 10, "b": 30, "c": 60}
    handles = {n: serve_echo(n, key, setup.registry, metadata={"weight": w}) for n, w in weights.items()}
    run = start_xds_client(lang, f"xds:///{export}", setup.bootstrap, 200_000, batch=100, deadline=10.0)
    out: dict[str, dict[str, float]] = {}
    try:
        # the export's source may have answered before the registrations: until they are in, its assignment is
        # empty and calls fail at once (serve_empty); from the first batch with all three on, none may fail
        all_in = watch(run, lambda c: set(c) == {"a", "b", "c"}, 60.0, "a, b and c")
        run.progress(30.0)  # a batch more: every registration is in the assignment the client holds
        out["10/30/60"], n1 = _shares(run, 2000)
        for name, w in (("a", 80), ("b", 20), ("c", 0)):
            handles[name].update_metadata({"weight": w})
        watch(run, lambda c: "c" not in c and set(c) == {"a", "b"}, PROPAGATION_BOUND, "c drained")
        run.progress(30.0)
        out["80/20/0"], n2 = _shares(run, 2000)
        final = run.finish(30.0, interrupt=True)
        failed_after = sum(b.get("errors", 0) for b in run.batches if b["_at"] > all_in["_at"])
    finally:
        run.stop()
        for h in handles.values():
            h.stop(0)
    print(f"\n{lang} xDS client, export {export!r}, registered weights: 10/30/60 -> {out['10/30/60']} ({n1} calls); "
          f"80/20/0 -> {out['80/20/0']} ({n2} calls); {final['errors']} failed of {final['calls']} (before the "
          f"registrations were in: the empty assignment)")
    assert failed_after == 0, final
    _check_shares(out["10/30/60"], {"a": 10.0, "b": 30.0, "c": 60.0}, f"{lang} {export} 10/30/60")
    _check_shares(out["80/20/0"], {"a": 80.0, "b": 20.0}, f"{lang} {export} 80/20/0")
    return out
