"""Load reporting (LRS, gRFC A27) through ``waypost xds serve``, with the stock grpcio, grpc-go and grpc-java xDS
clients over a real etcd: the counts their reports carry match the calls they made, per locality (checked against
what each backend served); circuit breaking as each client enforces it with load reporting on and off; the ORCA
named metrics of grpc-go's orca-server in the reports; ``waypost xds status --load`` and the ``waypost_xds_load_*``
metrics of the same figures.

The backends are ``Gate`` servers: an Echo server that counts what it serves, fails the calls whose ``x-call``
header (the client's call index) is in its ``fail`` set, and holds the calls ``hold`` selects until the test
releases them. A held call keeps its client running, and reporting, after its other calls: its reports are then
whole (a client that exits loses the counts of its last interval), and calls in flight are known exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.xds.go_peers import go_programs, go_timeout_mark
from tests.xds.java_peers import JAVA_MAIN, java_binary, java_classpath, java_timeout_mark
from tests.xds.orca_peers import ClientRun, client_args, start_orca_server
from tests.xds.peer_procs import ROOT, fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.test_xds_traffic import toml_config
from tests.xds.xds_peers import xds_control_plane
from waypost import Publisher

pytestmark = pytest.mark.usefixtures("xds_procs")

#: seconds between two load reports of a client (short: the tests wait for reports, they never time them)
INTERVAL = 0.5
#: how long a held call may wait for its release (a bound; the tests release it as soon as they have looked)
HOLD_BOUND = 60.0


class Gate(echo_pb2_grpc.EchoServicer):
    """An Echo server that counts the calls it serves, fails some and holds some (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.hold: Callable[[int], bool] = lambda i: False
        self.fail: Callable[[int], bool] = lambda i: False
        self.reset()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        echo_pb2_grpc.add_EchoServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self, hold: Callable[[int], bool] = lambda i: False, fail: Callable[[int], bool] = lambda i: False
              ) -> None:
        with self.lock:
            self.hold, self.fail = hold, fail
            self.release.clear()
            self.ok = self.failed = self.in_flight = self.max_in_flight = 0

    def Unary(self, request: Any, context: Any) -> Any:
        index = int(dict(context.invocation_metadata()).get("x-call", "-1"))
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold(index):
                self.release.wait(HOLD_BOUND)
            if self.fail(index):
                with self.lock:
                    self.failed += 1
                context.abort(grpc.StatusCode.INTERNAL, f"call {index} fails (the test asked)")
            with self.lock:
                self.ok += 1
            return echo_pb2.EchoReply(message=request.message, server=self.name)
        finally:
            with self.lock:
                self.in_flight -= 1

    def stop(self) -> None:
        self.release.set()
        self.server.stop(0)


class LrsSetup:
    """``waypost xds serve --config FILE --load-reporting-interval 0.5 --metrics-port P`` over etcd: two Gates in
    zones a and b behind ``counted-LANG`` (one export per client language, so each test has its own totals), a
    holding Gate behind ``breaker-LANG`` (max_requests 2, load reporting) and ``breaker-plain`` (max_requests 2,
    no load reporting)."""

    def __init__(self, etcd: Any, tmp: Path) -> None:
        prefix = f"lrs{os.getpid()}"
        self.gates = {"a": Gate("zone-a"), "b": Gate("zone-b"), "breaker": Gate("breaker")}
        self.publishers = []
        keys = {"counted": f"{prefix}-counted.rpc", "breaker": f"{prefix}-breaker.rpc", "orca": f"{prefix}-orca.rpc"}
        for zone in ("a", "b"):
            self.publishers.append(Publisher(etcd.url(), keys["counted"], self.gates[zone].address, ttl=10,
                                             metadata={"region": "r1", "zone": zone}))
        self.publishers.append(Publisher(etcd.url(), keys["breaker"], self.gates["breaker"].address, ttl=10))
        self.orca = start_orca_server("orca-1", named={"queue": 3.0}, cpu=0.5) if _go_available() else None
        if self.orca is not None:
            self.publishers.append(Publisher(etcd.url(), keys["orca"], self.orca.address, ttl=10))
        for p in self.publishers:
            p.start()
        self.targets = target = {k: f"etcd:///{etcd.endpoint}?key={v}" for k, v in keys.items()}
        exports: dict[str, dict[str, Any]] = {}
        for lang in ("grpcio", "go", "java"):
            exports[f"counted-{lang}"] = {"target": target["counted"], "load_reporting": True}
            exports[f"breaker-{lang}"] = {"target": target["breaker"], "max_requests": 2, "load_reporting": True}
            exports[f"orca-{lang}"] = {"target": target["orca"], "load_reporting": True}
        exports["breaker-plain"] = {"target": target["breaker"], "max_requests": 2}
        exports["shown"] = {"target": target["counted"], "load_reporting": True}
        self.path = tmp / "xds.toml"
        self.path.write_text(toml_config(exports))
        self.metrics_port = _free_port()
        self.addr, self.bootstrap, self.proc = xds_control_plane(
            {}, extra_args=["--config", str(self.path), "--load-reporting-interval", str(INTERVAL),
                            "--metrics-port", str(self.metrics_port), "-v"])

    def load(self, addr: str | None = None) -> dict[str, Any]:
        from waypost.cli.xds_load import fetch_load

        return fetch_load(addr or self.addr, None, 5.0)

    def cluster(self, name: str, addr: str | None = None) -> dict[str, Any] | None:
        return next((c for c in self.load(addr)["clusters"] if c["cluster"] == name), None)

    def close(self) -> None:
        self.proc.stop()
        for p in self.publishers:
            p.stop()
        for g in self.gates.values():
            g.stop()
        if self.orca is not None:
            self.orca.stop()


def _go_available() -> bool:
    from tests.xds.go_peers import go_skip_reason

    return go_skip_reason() is None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", name="setup")
def fixture_setup(shared_etcd: Any, tmp_path_factory: Any) -> Iterator[LrsSetup]:
    s = LrsSetup(shared_etcd, tmp_path_factory.mktemp("lrs"))
    try:
        yield s
    finally:
        s.close()


# -- the clients ---------------------------------------------------------------------------------------------

#: grpcio as the stock clients are driven: -calls, -parallel, -interval (s), -deadline (s), -header x-call={i}
_GRPCIO_CLIENT = r"""
import json, sys, time
from concurrent import futures
import grpc
from harness.backends import echo_pb2, echo_pb2_grpc

target, calls, parallel, interval, deadline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
stub = echo_pb2_grpc.EchoStub(grpc.insecure_channel(target))
counts, codes, errors = {}, {}, 0
def one(i):
    try:
        return stub.Unary(echo_pb2.EchoRequest(message="x"), metadata=(("x-call", str(i)),), timeout=deadline,
                          wait_for_ready=True).server
    except grpc.RpcError as e:
        return "!" + e.code().name
with futures.ThreadPoolExecutor(parallel) as pool:
    for start in range(0, calls, parallel):
        wave = []
        for i in range(start, min(start + parallel, calls)):
            wave.append(pool.submit(one, i))
            time.sleep(interval)
        for f in wave:
            r = f.result()
            if r.startswith("!"):
                errors += 1
                codes[r[1:]] = codes.get(r[1:], 0) + 1
            else:
                counts[r] = counts.get(r, 0) + 1
print(json.dumps({"counts": counts, "errors": errors, "codes": codes, "calls": calls}), flush=True)
"""


def start_client(lang: str, target: str, bootstrap: str, calls: int, *, parallel: int = 1,
                 interval: float = 0.0) -> ClientRun:
    """``lang``'s stock xDS client making ``calls`` calls (``parallel`` at a time, started ``interval`` s apart),
    each with its index in the ``x-call`` header, wait-for-ready, a 60 s deadline."""
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap}
    if lang == "grpcio":
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src")])
        argv = [sys.executable, "-c", _GRPCIO_CLIENT, target, str(calls), str(parallel), str(interval), "60"]
    else:
        args = [*client_args(calls, 0, interval, 60.0, {"x-call": "{i}"}, 0, True, 120.0)]
        if parallel > 1:
            args += ["-parallel", str(parallel)]
        if lang == "go":
            argv = [str(go_programs()["xds-client"]), "-target", target, *args]
        else:
            java = java_binary()
            assert java is not None
            argv = [java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", java_classpath(), JAVA_MAIN,
                    "-target", target, *args]
    run = ClientRun(argv, f"xds-client-{lang}", env=env, cwd=ROOT)
    run.batches = []
    return run


@pytest.fixture(params=["grpcio", pytest.param("go", marks=go_timeout_mark()),
                        pytest.param("java", marks=java_timeout_mark())])
def lang(request: Any) -> str:
    if request.param == "go":
        go_programs()  # build (or skip) first
    elif request.param == "java":
        java_classpath()
    return str(request.param)


def _totals(cluster: dict[str, Any] | None) -> dict[str, int]:
    if cluster is None:
        return {}
    locs = cluster["localities"]
    return {"issued": sum(x["issued"] for x in locs), "succeeded": sum(x["succeeded"] for x in locs),
            "errored": sum(x["errored"] for x in locs), "in_flight": sum(x["in_flight"] for x in locs),
            "dropped": cluster["dropped"]}


# -- the tests -----------------------------------------------------------------------------------------------

#: 21 calls: every fifth fails (4: calls 4, 9, 14, 19), the last one is held until the test has looked
CALLS = 21


def test_reports_count_the_calls_made_per_locality(lang: str, setup: LrsSetup) -> None:
    """While the client's last call is held, its reports add up to what it did: 21 issued, 16 succeeded, 4 errored,
    1 in flight; and per locality (r1/a, r1/b) to what that locality's backend served."""
    name = f"counted-{lang}"
    for zone in ("a", "b"):
        setup.gates[zone].reset(hold=lambda i: i == CALLS - 1, fail=lambda i: i % 5 == 4)
    run = start_client(lang, f"xds:///{name}", setup.bootstrap, CALLS)
    try:
        a, b = setup.gates["a"], setup.gates["b"]
        wait_until(lambda: a.in_flight + b.in_flight == 1 and a.ok + b.ok + a.failed + b.failed == CALLS - 1, 60.0,
                   "the client's last call held, the others served")
        want = {"issued": CALLS, "succeeded": CALLS - 1 - 4, "errored": 4, "in_flight": 1, "dropped": 0}
        got = wait_until(lambda: (t := _totals(setup.cluster(name))) == want and t, 30.0,
                         f"the load reports of {name} adding up to {want}")
        cluster = setup.cluster(name)
        assert cluster is not None
        print(f"\n{lang}: {got}; per locality: "
              f"{[(x['locality'], x['succeeded'], x['errored'], x['in_flight']) for x in cluster['localities']]}")
        per = {x["locality"]: x for x in cluster["localities"]}
        assert set(per) <= {"r1/a", "r1/b"}, per
        for zone in ("a", "b"):
            g, loc = setup.gates[zone], per.get(f"r1/{zone}")
            served = (loc or {}).get("succeeded", 0), (loc or {}).get("errored", 0), (loc or {}).get("in_flight", 0)
            assert served == (g.ok, g.failed, g.in_flight), (zone, served, g.ok, g.failed, g.in_flight)
        assert cluster["export"] == name and cluster["dropped"] == 0
        view = setup.load()
        assert view["clients"] >= 1 and view["interval"] == INTERVAL
    finally:
        for zone in ("a", "b"):
            setup.gates[zone].release.set()
    result = run.finish(60.0)
    assert sum(result["counts"].values()) == CALLS - 4 and result["errors"] == 4, result


def test_circuit_breaking_holds_max_requests_in_flight(lang: str, setup: LrsSetup) -> None:
    """max_requests = 2 with load reporting on, 6 calls started 20 ms apart to a backend that holds them: the
    backend sees exactly 2 in flight, the client reports 2 in flight and 4 dropped (circuit breaking is a drop
    without category), and ends with 2 served and 4 UNAVAILABLE. grpc-java does this too with LRS on (without
    it, see test_grpc_java_without_load_reporting_does_not_break_circuits)."""
    name = f"breaker-{lang}"
    gate = setup.gates["breaker"]
    gate.reset(hold=lambda i: True)
    run = start_client(lang, f"xds:///{name}", setup.bootstrap, 6, parallel=6, interval=0.02)
    try:
        want = {"issued": 2, "succeeded": 0, "errored": 0, "in_flight": 2, "dropped": 4}
        got = wait_until(lambda: (t := _totals(setup.cluster(name))) == want and t, 60.0,
                         f"{name}'s reports: 2 in flight, 4 dropped")
        assert gate.in_flight == 2 and gate.max_in_flight == 2, (gate.in_flight, gate.max_in_flight)
        cluster = setup.cluster(name)
        assert cluster is not None and cluster["dropped_by_category"] == {}, cluster
        print(f"\n{lang} max_requests 2, LRS on: backend in flight {gate.in_flight} (max {gate.max_in_flight}), "
              f"reports {got}")
    finally:
        gate.release.set()
    result = run.finish(60.0)
    codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}
    assert sum(result["counts"].values()) == 2 and codes == {"UNAVAILABLE": 4}, result
    assert gate.max_in_flight == 2


@java_timeout_mark()
def test_grpc_java_without_load_reporting_does_not_break_circuits(setup: LrsSetup) -> None:
    """The same 6 calls with max_requests = 2 but no load reporting: grpc-java 1.85 holds all 6 in flight and
    refuses none (it counts calls per cluster only when it reports load)."""
    java_classpath()
    gate = setup.gates["breaker"]
    gate.reset(hold=lambda i: True)
    run = start_client("java", "xds:///breaker-plain", setup.bootstrap, 6, parallel=6, interval=0.02)
    try:
        wait_until(lambda: gate.in_flight == 6, 60.0, "all 6 calls held at the backend")
        print(f"\njava max_requests 2, LRS off: backend in flight {gate.in_flight} (max {gate.max_in_flight})")
    finally:
        gate.release.set()
    result = run.finish(60.0)
    assert sum(result["counts"].values()) == 6 and result["errors"] == 0, result
    assert setup.cluster("breaker-plain") is None  # no load reported for it


@pytest.mark.parametrize("client", ["grpcio", pytest.param("go", marks=go_timeout_mark()),
                                    pytest.param("java", marks=java_timeout_mark())])
def test_orca_named_metrics_reach_the_reports(client: str, setup: LrsSetup) -> None:
    """grpc-go's orca-server returns named metric queue=3 and cpu 0.5 with each call: the client's reports carry
    them (gRFC A64/A85), so their mean over the calls is exactly what the backend sent."""
    go_programs()
    if client == "java":
        java_classpath()
    name = f"orca-{client}"
    run = start_client(client, f"xds:///{name}", setup.bootstrap, 400, interval=0.02)
    try:
        def metrics() -> dict[str, Any] | None:
            c = setup.cluster(name)
            m = {k: v for x in (c or {}).get("localities", []) for k, v in x["metrics"].items()}
            return m if m.get("named_metrics.queue", {}).get("count", 0) >= 5 else None

        got = wait_until(metrics, 60.0, f"named metrics in {name}'s reports")
    finally:
        run.stop()
    print(f"\n{client} ORCA in LRS: {got}")
    assert got["named_metrics.queue"]["mean"] == pytest.approx(3.0)
    assert got["named_metrics.queue"]["sum"] == pytest.approx(3.0 * got["named_metrics.queue"]["count"])


def test_status_load_and_metrics_show_the_reports(setup: LrsSetup) -> None:
    """5 calls of grpcio, the last held: ``waypost xds status --load`` prints the view's figures (plain text to a
    pipe; ``--json`` prints the view itself), and the ``waypost_xds_load_*`` metrics carry the same."""
    name = "shown"
    gates = (setup.gates["a"], setup.gates["b"])
    for g in gates:
        g.reset(hold=lambda i: i == 4)
    run = start_client("grpcio", f"xds:///{name}", setup.bootstrap, 5)
    try:
        want = {"issued": 5, "succeeded": 4, "errored": 0, "in_flight": 1, "dropped": 0}
        wait_until(lambda: _totals(setup.cluster(name)) == want, 60.0, f"{name}'s reports adding up to {want}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        out = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "status", "--server", setup.addr, "--load"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=True).stdout
        print("\n" + out)
        lines = out.splitlines()
        assert lines[0].startswith(f"{setup.addr}  load reported by ") and f"every {INTERVAL:g}s" in lines[0], out
        header = lines[1].split()
        assert header[:3] == ["EXPORT", "CLUSTER", "LOCALITY"] and header[-1] == "METRICS", out
        rows = [line.split() for line in lines[2:] if line.split()[0] == name]
        cluster = setup.cluster(name)
        assert cluster is not None
        assert [r[2] for r in rows] == [x["locality"] for x in cluster["localities"]], out
        for r, x in zip(rows, cluster["localities"]):
            # IN FLIGHT, SUCCEEDED, ERRORED as the view has them
            assert r[6:9] == [str(x["in_flight"]), str(x["succeeded"]), str(x["errored"])], (r, x)
        assert rows[0][9] == "0", rows  # DROPPED, on the cluster's first row
        as_json = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "xds", "status", "--server",
                                  setup.addr, "--load"], capture_output=True, text=True, env=env, cwd=ROOT,
                                 timeout=60, check=True).stdout
        shown = next(c for c in json.loads(as_json)["clusters"] if c["cluster"] == name)
        assert _totals(shown) == want, shown
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{setup.metrics_port}/metrics", timeout=10).read().decode()
        series = _series(scraped)
        for x in cluster["localities"]:
            labels = f'cluster="{name}",export="{name}",locality="{x["locality"]}"'
            assert series[f'waypost_xds_load_calls_total{{{labels},outcome="succeeded"}}'] == x["succeeded"], labels
            assert series[f'waypost_xds_load_calls_total{{{labels},outcome="errored"}}'] == 0
            assert series[f"waypost_xds_load_issued_total{{{labels}}}"] == x["issued"]
            assert series[f"waypost_xds_load_in_flight{{{labels}}}"] == x["in_flight"]
        assert series[f'waypost_xds_load_dropped_total{{category="uncategorized",cluster="{name}",export="{name}"}}'] == 0
        assert series["waypost_xds_load_reports_total"] >= 1 and series["waypost_xds_load_clients"] >= 1
    finally:
        for g in gates:
            g.release.set()
    run.finish(60.0)


def test_the_flag_turns_load_reporting_on_for_every_export(setup: LrsSetup) -> None:
    """``waypost xds serve --load-reporting``: an export given without the option reports load (3 calls of grpcio,
    the last held: 3 issued, 1 in flight), but one that says ``load_reporting=false`` does not."""
    addr, bootstrap, proc = xds_control_plane(
        {"flagged": setup.targets["counted"], "quiet": setup.targets["counted"] + " load_reporting=false"},
        extra_args=["--load-reporting", "--load-reporting-interval", str(INTERVAL)])
    gates = (setup.gates["a"], setup.gates["b"])
    for g in gates:
        g.reset(hold=lambda i: i == 2)
    runs = [start_client("grpcio", "xds:///flagged", bootstrap, 3)]
    try:
        want = {"issued": 3, "succeeded": 2, "errored": 0, "in_flight": 1, "dropped": 0}
        wait_until(lambda: _totals(setup.cluster("flagged", addr)) == want, 60.0, f"flagged's reports: {want}")
        runs.append(start_client("grpcio", "xds:///quiet", bootstrap, 3))
        wait_until(lambda: sum(g.in_flight for g in gates) == 2, 60.0, "quiet's last call held too")
        lrs = wait_until(lambda: (got := _lrs_servers(addr)) and set(got) == {"flagged", "quiet"} and got, 30.0,
                         "both Clusters in the client status")
        assert lrs == {"flagged": True, "quiet": False}, lrs
        assert setup.cluster("quiet", addr) is None  # nothing reported for it meanwhile
    finally:
        for g in gates:
            g.release.set()
        for r in runs:
            r.stop()
        proc.stop()


def _lrs_servers(addr: str) -> dict[str, bool]:
    """Cluster name -> whether it names a load-reporting server, from what the control plane's clients hold
    (CSDS)."""
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

    from waypost.xds.resources import CLUSTER

    with grpc.insecure_channel(addr) as channel:
        resp = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel).FetchClientStatus(
            csds_pb2.ClientStatusRequest(), timeout=10)
    out = {}
    for config in resp.config:
        for g in config.generic_xds_configs:
            if g.type_url == CLUSTER and g.HasField("xds_config"):
                c = cluster_pb2.Cluster.FromString(g.xds_config.value)
                out[c.name] = c.HasField("lrs_server")
    return out


def _series(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels sorted}': value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if "{" in key:
            name, _, rest = key.partition("{")
            labels = sorted(rest.rstrip("}").split(","))
            key = f"{name}{{{','.join(labels)}}}"
        out[key] = float(value)
    return out
